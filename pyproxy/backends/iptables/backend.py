"""The iptables backend: renders with ``render``/``table`` and applies through the iptables
toolkit.

A partial sync is one ``iptables-restore --noflush`` transaction per IP family, holding the
filter and nat tables, that rewrites only the changed services' own chains and turns their
lines in the top-level chains into ``-D``/``-I``. Upstream rewrites KUBE-SERVICES (one rule per
service address) on every sync, which on the nf_tables back end costs as much as the whole
table (1.77 s vs 0.08 s at 10,000 services, ../shared/reference/kernel-facts.md); here a
partial sync costs what changed, and one with nothing to write runs no program at all. If a
partial restore fails (drift: a rule we expected is gone) the same sync falls back to a full
one.

A full sync (at start, after a failure, on a node change, when the canary is gone, hourly)
rewrites everything pyproxy owns. On the nf_tables back end one large ``--noflush``
transaction costs time quadratic in its size (84,024 lines: 26 s, where a quarter of it takes
1.0 s), so a large full sync is split into ordered transactions (``Rendered.batches``): the
services' own chains first, endpoint chains before the chains that jump to them, then one
transaction with the top-level chains that make them reachable. Each transaction is atomic;
between them the kernel holds new chains nothing jumps to yet, or rewritten chains whose
targets exist, never a jump to a missing or half-written chain. The legacy back end replaces
the whole table on every commit, so there a full sync stays one transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, cast

from prometheus_client import CollectorRegistry, Gauge

from pyproxy.backends.base import (
    Backend,
    BackendError,
    Difference,
    ServiceTraffic,
    SyncRequest,
    SyncResult,
    by_service_port,
)
from pyproxy.backends.engine.engine import DeleteConntrack, Engine
from pyproxy.backends.iptables import names
from pyproxy.backends.iptables.render import (
    FILTER_TOP,
    JUMP_RULES,
    KUBE_FIREWALL,
    KUBELET_FIREWALL_JUMPS,
    NAT_TOP,
    IptablesConfig,
)
from pyproxy.backends.iptables.table import (
    Rendered,
    Renderer,
    Updates,
    partial_restore,
)
from pyproxy.backends.local_addresses import with_local_addresses
from pyproxy.backends.metrics import FAMILY, RestoreFailures, SyncDurations
from pyproxy.backends.sysctls import require_sysctls
from pyproxy.backends.trace import Packet, Trace
from pyproxy.backends.xtables.compare import compare as xtables_compare
from pyproxy.backends.xtables.counters import dnat_counts
from pyproxy.backends.xtables.rules import KUBE_MARK_MASQ, KUBE_PROXY_CANARY
from pyproxy.backends.xtables.tables import (
    DriftWatch,
    canary_present,
    cleanup_everywhere,
    ensure_canary,
    ensure_jumps,
    open_tables,
)
from pyproxy.backends.xtables.walk import Walker
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import conntrack
from pyproxy.kernel.iptables import Iptables, IptablesError, chains_in_save, extract_lines
from pyproxy.model.types import IPFamily, ProxyState

log = logging.getLogger(__name__)

FAMILIES = (IPFamily.IPV4, IPFamily.IPV6)
BATCH_LINES = 4_000
"""Rules per transaction of a large full sync on the nf_tables back end (see above)."""


class IptablesFamily:
    """One family's part of a sync (the engine's FamilyWriter): restore input from the
    rendered table, applied through ``ipt``."""

    def __init__(self, backend: IptablesBackend, cfg: IptablesConfig, ipt: Iptables) -> None:
        self.cfg = cfg
        self.family = cfg.family
        self.ipt = ipt
        self.cache = Renderer(cfg)
        self.drift = DriftWatch(ipt)
        self._backend = backend

    def before_partial(self, programmed: Rendered, now: float) -> str:
        return ""

    def deferred_until(self) -> float | None:
        return None

    def write_partial(self, programmed: Rendered, updates: Updates) -> Callable[[], None]:
        restore = partial_restore(programmed, updates)
        if restore.text:
            self._backend.restore(self, restore.text, partial=True)
        return lambda: self._backend.count(self, programmed, restore.written)

    def write_full(self, new: Rendered) -> None:
        ensure_canary(self.ipt)
        try:
            existing = chains_in_save(self.ipt.save("nat"))
        except IptablesError as err:
            log.error("iptables-save failed, stale chains stay until the next full sync: %s", err)
            existing = set()
        stale = {c for c in existing if names.is_service_chain(c)} - new.service_chains()
        batch = BATCH_LINES if self.ipt.backend == "nft" else None
        texts = new.batches(delete_chains=stale, max_lines=batch)
        for i, text in enumerate(texts):
            self._backend.restore(self, text)
            if len(texts) > 1:
                log.info("full sync: transaction %d of %d applied", i + 1, len(texts))
        declared = {("filter", c) for c in new.filter_chain_names()} | {("nat", c) for c in NAT_TOP}
        ensure_jumps(self.ipt, self.cfg.jump_rules(), declared)
        self._backend.count(self, new, new.counts)


class IptablesMetrics:
    """The families upstream registers for iptables mode."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.durations = SyncDurations(registry)
        self.restore_failures = RestoreFailures(registry, partial=True)
        self.rules_total = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            ("table", *FAMILY),
            registry=registry,
        )
        self.rules_last = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            ("table", *FAMILY),
            registry=registry,
        )


class IptablesBackend(Backend):
    mode = "iptables"

    def __init__(
        self,
        cfg: ProxyConfig,
        tables: Mapping[IPFamily, Iptables] | None = None,
        delete_conntrack: DeleteConntrack = conntrack.delete,
        sysctls: Callable[..., None] = require_sysctls,
    ) -> None:
        """``tables``, ``delete_conntrack`` and ``sysctls`` are the kernel ports (default: the
        iptables back end chosen by the configuration, the conntrack tool, and /proc/sys of
        this network namespace)."""
        self.proxy = cfg
        self._tables = tables
        self._sysctls = sysctls
        self._delete_conntrack = delete_conntrack
        self.configs = {f: IptablesConfig(family=f, proxy=cfg) for f in FAMILIES}
        self._engine: Engine[Rendered] | None = None
        self.metrics: IptablesMetrics | None = None
        self._writing = threading.Lock()
        """Held by a sync; the drift check waits for it (a half-written table is no drift)."""

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.metrics = IptablesMetrics(registry)

    # ---- render ---------------------------------------------------------------------------

    def render(self, state: ProxyState) -> str:
        parts = []
        for family in FAMILIES:
            if family is IPFamily.IPV6 and not state.sorted_services(family):
                continue
            tool = "ip6tables-restore" if family is IPFamily.IPV6 else "iptables-restore"
            parts.append(
                f"# {family.value}: input for {tool} --noflush\n"
                + Renderer(self.configs[family]).render(state).text()
            )
        return "".join(parts)

    def compare(self, state: ProxyState) -> list[Difference]:
        state = with_local_addresses(state, self.proxy)
        out: list[Difference] = []
        tables = open_tables(self.proxy.iptables_backend, FAMILIES, self.mode, writes=False)
        for family, ipt in tables.items():
            cfg = self.configs[family]
            out += xtables_compare(ipt, Renderer(cfg).render(state).text(), cfg.jump_rules())
        return out

    def trace(self, state: ProxyState, packet: Packet) -> Trace:
        cfg = self.configs[packet.family]
        walker = self.walker(state, packet.family, lambda: Walker(
            Renderer(cfg).render(state).tables(), cfg.jump_rules(), state.node.local_addresses,
            cfg.mark))  # fmt: skip
        return Trace(packet, self.mode, tuple(walker.walk(packet)))

    def service_traffic(self) -> dict[str, ServiceTraffic]:
        """The KUBE-SEP DNAT rules' counters: new connections (a connection's first packet is
        the only one the nat table sees) and the bytes of those first packets, each chain
        counted for the service port pyproxy rendered it for."""
        counted: list[tuple[str, ServiceTraffic]] = []
        for fam in self.writers():
            programmed = self.programmed(fam.family)
            owners = programmed.counted_chains() if programmed else {}
            try:
                counts = dnat_counts(fam.ipt.save("nat", counters=True))
            except IptablesError as err:
                raise BackendError(f"cannot read rule counters: {err}") from None
            counted += [(owners[chain], ServiceTraffic(n, n, b))
                        for chain, (n, b) in counts.items() if chain in owners]  # fmt: skip
        return by_service_port(counted)

    # ---- sync -----------------------------------------------------------------------------

    def prepare(self) -> None:
        self.writers()

    def writers(self) -> list[IptablesFamily]:
        """Each family's part of a sync (sets up the kernel ports on first use)."""
        return [cast(IptablesFamily, f.writer) for f in self._engine_set_up().families]

    def _engine_set_up(self) -> Engine[Rendered]:
        if self._engine is None:
            tables = self._tables or open_tables(self.proxy.iptables_backend, FAMILIES, self.mode)
            writers = [IptablesFamily(self, self.configs[f], ipt) for f, ipt in tables.items()]
            if self.configs[IPFamily.IPV4].localhost_enabled and IPFamily.IPV4 in tables:
                self._sysctls([("net.ipv4.conf.all.route_localnet", "1")],
                                "NodePorts on localhost",
                                "pass --iptables-localhost-nodeports=false")  # fmt: skip
            self._engine = Engine(writers, self._delete_conntrack)
        return self._engine

    def drifted(self) -> bool:
        """The canary (a family whose mangle KUBE-PROXY-CANARY chain is gone was flushed), or
        one of pyproxy's rules changed or deleted by someone else (DriftWatch): either needs a
        full sync. Never while a sync writes."""
        with self._writing:
            for writer, _ in self._engine.trusted() if self._engine else ():
                fam = cast(IptablesFamily, writer)
                if not canary_present(fam.ipt):
                    return True
                if fam.drift.changed():
                    log.warning("%s: a rule of pyproxy's was changed or deleted (the canary "
                                "is still there)", fam.ipt.family_name)  # fmt: skip
                    return True
            return False

    def debug_state(self) -> dict[str, Any]:
        """Per family, whether the drift check holds a baseline (it does once pyproxy has not
        written for a sync period)."""
        return {"driftCheck": {w.family.value: "armed" if w.drift.armed else "waiting"
                               for w in (self.writers() if self._engine else ())}}  # fmt: skip

    def sync(self, request: SyncRequest) -> SyncResult:
        with self._writing:
            start = time.monotonic()
            engine = self._engine_set_up()
            result = engine.sync(with_local_addresses(request.state, self.proxy), request)
            if self.metrics is not None:
                self.metrics.durations.observe(result.full, time.monotonic() - start,
                                               result.families)  # fmt: skip
            return result

    def programmed(self, family: IPFamily) -> Rendered | None:
        """The rule set pyproxy last wrote (or tried to) for ``family``."""
        return self._engine.programmed(family) if self._engine else None

    def count(self, fam: IptablesFamily, programmed: Rendered, written: Counter[str]) -> None:
        """``written``: the rules the last sync wrote, per table."""
        if self.metrics is None:
            return
        for table in ("filter", "nat"):
            self.metrics.rules_total.labels(table, fam.family.value).set(programmed.counts[table])
            self.metrics.rules_last.labels(table, fam.family.value).set(written[table])

    def restore(self, fam: IptablesFamily, text: str, partial: bool = False) -> None:
        fam.drift.wrote()
        try:
            with self.transactions.applying(fam.ipt.restore_label, text):
                fam.ipt.restore(text)
        except IptablesError as err:
            if self.metrics is not None:
                self.metrics.restore_failures.failed(fam.family, partial)
            where = f"\n{extract_lines(text, err.line)}" if err.line else ""
            log.error("%s restore failed: %s%s", fam.family.value, err, where)
            raise BackendError(f"{fam.family.value} iptables-restore failed: {err}") from None

    # ---- cleanup --------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove every chain and jump rule pyproxy's iptables mode creates, in both back ends;
        KUBE-FIREWALL and KUBE-MARK-MASQ only when nothing else (kubelet) still uses them."""
        cleanup_everywhere(
            JUMP_RULES + KUBELET_FIREWALL_JUMPS,
            {
                "filter": (*FILTER_TOP, KUBE_FIREWALL, KUBE_PROXY_CANARY),
                "nat": lambda c: (
                    c in NAT_TOP or c == KUBE_PROXY_CANARY or names.is_service_chain(c)
                ),
            },
            shared=(KUBE_FIREWALL, KUBE_MARK_MASQ),
            canary=True,
        )
