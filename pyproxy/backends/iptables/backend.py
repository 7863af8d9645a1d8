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
from collections.abc import Collection
from dataclasses import dataclass, field

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
from pyproxy.backends.iptables import names
from pyproxy.backends.iptables.render import (
    FILTER_TOP,
    JUMP_RULES,
    KUBE_FIREWALL,
    KUBELET_FIREWALL_JUMPS,
    NAT_TOP,
    IptablesConfig,
)
from pyproxy.backends.iptables.table import Rendered, Renderer, Updates, partial_text
from pyproxy.backends.local_addresses import with_local_addresses
from pyproxy.backends.metrics import FAMILY, RestoreFailures, SyncDurations
from pyproxy.backends.stale_conntrack import stale_filters
from pyproxy.backends.sysctls import require_sysctls
from pyproxy.backends.trace import Packet, Trace
from pyproxy.backends.xtables.compare import compare as xtables_compare
from pyproxy.backends.xtables.counters import parse
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
from pyproxy.model.types import IPFamily, NamespacedName, ProxyState

log = logging.getLogger(__name__)

FAMILIES = (IPFamily.IPV4, IPFamily.IPV6)
BATCH_LINES = 4_000
"""Rules per transaction of a large full sync on the nf_tables back end (see above)."""


@dataclass
class _Family:
    cfg: IptablesConfig
    ipt: Iptables
    renderer: Renderer
    programmed: Rendered | None = None
    """The last rule set written; also the render cache of the next full sync."""
    trusted: bool = False
    """Whether the kernel holds ``programmed`` (False after a failed restore)."""
    last_state: ProxyState | None = None
    drift: DriftWatch = field(init=False)

    def __post_init__(self) -> None:
        self.drift = DriftWatch(self.ipt)

    @property
    def family(self) -> IPFamily:
        return self.cfg.family


def _written(texts: Collection[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for text in texts:
        table = ""
        for line in text.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(("-A ", "-I ")):
                counts[table] += 1
    return counts


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

    def __init__(self, cfg: ProxyConfig) -> None:
        self.proxy = cfg
        self.configs = {f: IptablesConfig(family=f, proxy=cfg) for f in FAMILIES}
        self._families: list[_Family] | None = None
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
                + Renderer(self.configs[family]).full(state).text()
            )
        return "".join(parts)

    def compare(self, state: ProxyState) -> list[Difference]:
        state = with_local_addresses(state, self.proxy)
        out: list[Difference] = []
        tables = open_tables(self.proxy.iptables_backend, FAMILIES, self.mode, writes=False)
        for family, ipt in tables.items():
            cfg = self.configs[family]
            out += xtables_compare(ipt, Renderer(cfg).full(state).text(), cfg.jump_rules())
        return out

    def trace(self, state: ProxyState, packet: Packet) -> Trace:
        cfg = self.configs[packet.family]
        walker = self.walker(state, packet.family, lambda: Walker(
            Renderer(cfg).full(state).text(), cfg.jump_rules(), state.node.local_addresses,
            cfg.mark))  # fmt: skip
        return Trace(packet, self.mode, tuple(walker.walk(packet)))

    def service_traffic(self) -> dict[str, ServiceTraffic]:
        """The KUBE-SEP DNAT rules' counters: new connections (a connection's first packet is
        the only one the nat table sees) and the bytes of those first packets."""
        try:
            saves = [fam.ipt.save("nat", counters=True) for fam in self._setup()]
        except IptablesError as err:
            raise BackendError(f"cannot read rule counters: {err}") from None
        return by_service_port(
            (name, ServiceTraffic(c.connections, c.connections, c.bytes))
            for save in saves
            for name, c in parse(save, "").items()
        )

    # ---- sync -----------------------------------------------------------------------------

    def prepare(self) -> None:
        self._setup()

    def _setup(self) -> list[_Family]:
        if self._families is None:
            tables = open_tables(self.proxy.iptables_backend, FAMILIES, self.mode)
            self._families = [
                _Family(self.configs[f], ipt, Renderer(self.configs[f]))
                for f, ipt in tables.items()
            ]
            if self.configs[IPFamily.IPV4].localhost_enabled and IPFamily.IPV4 in tables:
                require_sysctls([("net.ipv4.conf.all.route_localnet", "1")],
                                "NodePorts on localhost",
                                "pass --iptables-localhost-nodeports=false")  # fmt: skip
        return self._families

    def drifted(self) -> bool:
        """The canary (a family whose mangle KUBE-PROXY-CANARY chain is gone was flushed), or
        one of pyproxy's rules changed or deleted by someone else (DriftWatch): either needs a
        full sync. Never while a sync writes."""
        with self._writing:
            for f in self._families or ():
                if f.programmed is None or not f.trusted:
                    continue
                if not canary_present(f.ipt):
                    return True
                if f.drift.changed():
                    log.warning("%s: a rule of pyproxy's was changed or deleted (the canary "
                                "is still there)", f.ipt.family_name)  # fmt: skip
                    return True
            return False

    def sync(self, request: SyncRequest) -> SyncResult:
        with self._writing:
            return self._sync(request)

    def _sync(self, request: SyncRequest) -> SyncResult:
        start = time.monotonic()
        fams = self._setup()
        state = with_local_addresses(request.state, self.proxy)
        times = [0.0, 0.0]  # render, apply
        did_full = False
        no_local: dict[tuple[str, IPFamily], int] = {}
        for fam in fams:
            full, texts = self._sync_family(fam, state, request, times)
            did_full = did_full or full
            programmed = fam.programmed
            assert programmed is not None
            for policy, n in programmed.no_local.items():
                no_local[(policy, fam.family)] = n
            self._count(fam, programmed, texts)
            self._clear_conntrack(fam, state, None if full else request.changed)
            fam.last_state = state
        families = tuple(f.family for f in fams)
        if self.metrics is not None:
            self.metrics.durations.observe(did_full, time.monotonic() - start, families)
        return SyncResult(
            full=did_full,
            families=families,
            render_seconds=times[0],
            apply_seconds=times[1],
            no_local_endpoints=no_local,
        )

    def _sync_family(
        self, fam: _Family, state: ProxyState, request: SyncRequest, times: list[float]
    ) -> tuple[bool, list[str]]:
        """(full?, transactions written); a partial sync falls back to a full one when the
        changes need it or its restore fails."""
        full = request.full or fam.programmed is None or not fam.trusted
        if not full and fam.programmed is not None:
            t0 = time.monotonic()
            updates = fam.renderer.updates(state, request.changed, fam.programmed)
            t1 = time.monotonic()
            times[0] += t1 - t0
            if updates is not None:
                try:
                    return False, self._partial(fam, fam.programmed, updates)
                except BackendError as err:
                    log.warning("partial sync failed (%s); doing a full sync", err)
                finally:
                    times[1] += time.monotonic() - t1
        t0 = time.monotonic()
        new = fam.renderer.full(state, fam.programmed)
        t1 = time.monotonic()
        try:
            return True, self._full(fam, new)
        finally:
            times[0] += t1 - t0
            times[1] += time.monotonic() - t1

    def _partial(self, fam: _Family, programmed: Rendered, updates: Updates) -> list[str]:
        text = partial_text(programmed, updates)
        if text:
            try:
                self._restore(fam, text, partial=True)
            except BackendError:
                fam.trusted = False  # the kernel is not what we think: only a full sync now
                raise
        programmed.apply(updates)
        return [text] if text else []

    def _full(self, fam: _Family, new: Rendered) -> list[str]:
        ensure_canary(fam.ipt)
        try:
            existing = chains_in_save(fam.ipt.save("nat"))
        except IptablesError as err:
            log.error("iptables-save failed, stale chains stay until the next full sync: %s", err)
            existing = set()
        stale = {c for c in existing if names.is_service_chain(c)} - new.service_chains()
        batch = BATCH_LINES if fam.ipt.backend == "nft" else None
        texts = new.batches(delete_chains=stale, max_lines=batch)
        fam.programmed, fam.trusted = new, False
        for i, text in enumerate(texts):
            self._restore(fam, text)
            if len(texts) > 1:
                log.info("full sync: transaction %d of %d applied", i + 1, len(texts))
        fam.trusted = True
        declared = {("filter", c) for c in new.filter_chain_names()} | {("nat", c) for c in NAT_TOP}
        ensure_jumps(fam.ipt, fam.cfg.jump_rules(), declared)
        return texts

    def _clear_conntrack(
        self, fam: _Family, state: ProxyState, changed: Collection[NamespacedName] | None
    ) -> None:
        filters = stale_filters(fam.last_state, state, fam.family, changed)
        if filters:
            n = conntrack.delete(filters, ipv6=fam.family is IPFamily.IPV6)
            log.info("cleared %d stale UDP conntrack entries (%s)", n, fam.family.value)

    def _count(self, fam: _Family, programmed: Rendered, texts: list[str]) -> None:
        if self.metrics is None:
            return
        written = _written(texts)
        for table in ("filter", "nat"):
            self.metrics.rules_total.labels(table, fam.family.value).set(programmed.counts[table])
            self.metrics.rules_last.labels(table, fam.family.value).set(written[table])

    def _restore(self, fam: _Family, text: str, partial: bool = False) -> None:
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
