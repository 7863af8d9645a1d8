"""The nftables backend: upstream kube-proxy v1.36's table ``kube-proxy`` in family ip and ip6,
rendered per service (``render``, ``table``) and written through libnftables (``kernel.nft``).

A partial sync is one transaction per family holding only what changed: the changed services'
chains, their affinity sets, and the set and map elements that differ from what was written
(a mirror in memory: nothing is read back). A full sync (at start, after a failure, when the
node's facts or the service CIDRs change, when the table was removed, hourly) rewrites
everything in one transaction. Stale chains are flushed at once and deleted
by a later sync, at least a second on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import cast

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from pyproxy.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Difference,
    ServiceTraffic,
    SyncRequest,
    SyncResult,
    by_service_port,
)
from pyproxy.backends.engine.engine import DeleteConntrack, Engine
from pyproxy.backends.local_addresses import with_local_addresses
from pyproxy.backends.metrics import FAMILY, SyncDurations
from pyproxy.backends.nftables import transactions as tx
from pyproxy.backends.nftables.compare import compare as nft_compare
from pyproxy.backends.nftables.localhost import LocalhostNodePorts
from pyproxy.backends.nftables.names import is_service_counter
from pyproxy.backends.nftables.render import (
    LOCALHOST_PROTOCOLS,
    TABLE,
    NftConfig,
    localhost_reject_counter,
)
from pyproxy.backends.nftables.table import Rendered, Renderer, Updates
from pyproxy.backends.nftables.walk import Walker, table_of
from pyproxy.backends.trace import Packet, Trace
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import conntrack
from pyproxy.kernel.nft import Nft, NftError
from pyproxy.model.types import IPFamily, NamespacedName, ProxyState

log = logging.getLogger(__name__)

FAMILIES = (IPFamily.IPV4, IPFamily.IPV6)
FRESH_PROCESS_RULES = 5_000
"""A full sync with more rules than this runs in an ``nft`` process rather than in pyproxy's
libnftables: parsing 150,000 lines (10,000 services) grows a process by about 360 MB, which
libnftables keeps; a process that exits gives it back."""


class RejectedPackets(Collector):
    """``kubeproxy_nftables_localhost_nodeport_rejected_packets_total``: the table's named
    counters, read at each scrape (upstream's nftCounterMetricCollector)."""

    def __init__(self, read: Callable[[IPFamily], dict[str, tuple[int, int]]]) -> None:
        self.read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        metric = CounterMetricFamily(
            "kubeproxy_nftables_localhost_nodeport_rejected_packets",
            "Number of packets rejected on localhost NodePorts. UDP and SCTP are always "
            "rejected; TCP is rejected when the localhost NodePort proxy is not running",
            labels=("ip_family", "protocol"),
        )
        for family in FAMILIES:
            try:
                packets = self.read(family)
            except NftError as err:
                log.warning("cannot read the localhost NodePort counters: %s", err)
                continue
            for proto in LOCALHOST_PROTOCOLS:
                n = packets.get(localhost_reject_counter(proto))
                if n is not None:
                    metric.add_metric((family.value, proto.upper()), n[0])
        yield metric


class NftablesMetrics:
    """The families upstream registers for nftables mode (the localhost NodePort ones, as
    upstream's feature gate, only when loopback serves NodePorts)."""

    def __init__(self, registry: CollectorRegistry, localhost: bool) -> None:
        self.durations = SyncDurations(registry)
        self.sync_failures = Counter(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            FAMILY,
            registry=registry,
        )
        self.cleanup_failures = Counter(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
            "Cumulative proxy nftables cleanup failures",
            FAMILY,
            registry=registry,
        )
        self.listeners: Gauge | None = None
        self.listener_failures: Counter | None = None
        if localhost:
            self.listeners = Gauge(
                "kubeproxy_nftables_localhost_nodeport_listeners",
                "Number of active localhost NodePort userspace proxy listeners.",
                FAMILY,
                registry=registry,
            )
            self.listener_failures = Counter(
                "kubeproxy_nftables_localhost_nodeport_listener_creation_failures",
                "Number of localhost NodePort userspace proxy listener creation failures.",
                FAMILY,
                registry=registry,
            )


class NftablesFamily:
    """One family's part of a sync (the engine's FamilyWriter): nft transactions from the
    rendered table, with a mirror of the elements written so that a partial transaction
    holds only what differs and nothing is read back."""

    def __init__(self, backend: NftablesBackend, cfg: NftConfig, nft: Nft) -> None:
        self.cfg = cfg
        self.family = cfg.family
        self.cache = Renderer(cfg)
        self.mirror = tx.Mirror()
        self._nft = nft
        self._backend = backend

    def deferred_until(self) -> float | None:
        pending = self.mirror.stale_chains.values()
        return min(pending) + tx.STALE_CHAIN_DELAY if pending else None

    def before_partial(self, programmed: Rendered, now: float) -> str:
        """Delete chains flushed long enough ago; a reason for a full sync if that failed."""
        text, due = tx.stale_deletions(programmed, self.mirror, now)
        if not text:
            return ""
        try:
            with self._backend.transactions.applying(self._what, text):
                self._nft.run(text)
        except NftError as err:
            log.warning("cannot delete %d stale chains (%s)", len(due), err)
            self._backend.cleanup_failed(self.family)
            return "stale chains could not be deleted"
        for chain in due:
            self.mirror.stale_chains.pop(chain, None)
        log.info("deleted %d stale chains (%s)", len(due), self.family.value)
        return ""

    @property
    def _what(self) -> str:
        return f"{self.family.value} nftables transaction"

    def write_partial(self, programmed: Rendered, updates: Updates) -> Callable[[], None]:
        written = tx.partial(programmed, updates, self.mirror)
        if written.text:
            self._run(written.text)
        return lambda: tx.written_after_partial(written, self.mirror, self._backend.clock())

    def write_full(self, new: Rendered) -> None:
        nft_family = self.cfg.nft_family
        try:
            existing = self._nft.names(nft_family, TABLE)
        except NftError as err:
            raise BackendError(f"cannot list the {nft_family} {TABLE} table: {err}") from None
        try:
            counters = [n for n in self._nft.counters(nft_family, TABLE) if is_service_counter(n)]
        except NftError as err:
            raise BackendError(f"cannot list the {nft_family} counters: {err}") from None
        written = tx.full(new, self.mirror, existing["chain"], existing["set"], existing["map"],
                          counters)  # fmt: skip
        self._run(written.text, fresh=new.rule_count() > FRESH_PROCESS_RULES)
        tx.written_after_full(new, written, self.mirror, self._backend.clock())

    def _run(self, text: str, fresh: bool = False) -> None:
        try:
            with self._backend.transactions.applying(self._what, text):
                self._nft.run(text, fresh=fresh)
        except NftError as err:
            self._backend.sync_failed(self.family)
            raise BackendError(f"{self.family.value} nftables transaction failed: {err}") from None


class NftablesBackend(Backend):
    mode = "nftables"

    def __init__(
        self,
        cfg: ProxyConfig,
        nft: Nft | None = None,
        delete_conntrack: DeleteConntrack = conntrack.delete,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``nft`` and ``delete_conntrack`` are the kernel ports (default: libnftables, or
        the nft tool, and the conntrack tool); ``clock`` times the deletion of stale chains."""
        self.proxy = cfg
        self.clock = clock
        self.configs = {f: NftConfig(family=f, proxy=cfg) for f in FAMILIES}
        self._port = nft
        self._delete_conntrack = delete_conntrack
        self._nft: Nft | None = None
        self._engine: Engine[Rendered] | None = None
        self.metrics: NftablesMetrics | None = None
        self.localhost = LocalhostNodePorts(
            f for f in FAMILIES if self.configs[f].localhost_nodeports
        )

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.metrics = NftablesMetrics(registry, bool(self.localhost.families))
        if self.localhost.families:
            registry.register(RejectedPackets(self._counters))

    def _counters(self, family: IPFamily) -> dict[str, tuple[int, int]]:
        if self._nft is None:
            return {}
        return self._nft.counters(self.configs[family].nft_family, TABLE)

    def service_traffic(self) -> dict[str, ServiceTraffic]:
        """The named counters of the service ports' DNAT rules (--service-metrics): new
        connections (the nat chains see a connection's first packet only) and their bytes."""
        if not self.proxy.service_metrics:
            raise BackendUnavailable(
                "nftables mode counts traffic per service with --service-metrics only "
                "(upstream's table has no counters)"
            )
        counted: list[tuple[str, ServiceTraffic]] = []
        for fam in self.writers() if self._engine else ():
            programmed = self.programmed(fam.family)
            owners = programmed.service_counters() if programmed else {}
            try:
                values = self._counters(fam.family)
            except NftError as err:
                raise BackendError(f"cannot read the nftables counters: {err}") from None
            counted += [
                (owners[name], ServiceTraffic(packets, packets, octets))
                for name, (packets, octets) in values.items()
                if name in owners
            ]
        return by_service_port(counted)

    def render(self, state: ProxyState) -> str:
        """The transaction a full sync writes into an empty namespace, per family."""
        parts = []
        for family in FAMILIES:
            if family is IPFamily.IPV6 and not state.sorted_services(family):
                continue
            r = Renderer(self.configs[family]).render(state)
            parts.append(f"# {family.value}: input for nft -f\n" + tx.fresh(r))
        return "".join(parts)

    def compare(self, state: ProxyState) -> list[Difference]:
        state = with_local_addresses(state, self.proxy)
        out: list[Difference] = []
        for family in FAMILIES:
            cfg = self.configs[family]
            out += nft_compare(cfg.nft_family, TABLE, tx.fresh(Renderer(cfg).render(state)))
        return out

    def trace(self, state: ProxyState, packet: Packet) -> Trace:
        def make() -> Walker:
            r = Renderer(self.configs[packet.family]).render(state)
            return Walker(table_of(r), state.node.local_addresses)

        walker = self.walker(state, packet.family, make)
        return Trace(packet, self.mode, tuple(walker.walk(packet)))

    # ---- set-up ---------------------------------------------------------------------------

    def prepare(self) -> None:
        self._setup()

    def _setup(self) -> Engine[Rendered]:
        if self._engine is None:
            nft = self._port or Nft()
            reason = nft.usable()
            if reason is not None:
                raise BackendUnavailable(f"--mode=nftables: {reason}")
            writers = []
            for cfg in self.configs.values():
                probe = f"table {cfg.nft_family} pyproxy-probe"
                try:
                    nft.run(f"add {probe}\ndelete {probe}\n")
                except NftError as err:
                    log.warning("nftables family %s does not work here (%s)", cfg.nft_family, err)
                    continue
                writers.append(NftablesFamily(self, cfg, nft))
            log.info("nftables mode: %s, families %s", nft.how,
                     ", ".join(w.family.value for w in writers))  # fmt: skip
            self._nft, self._engine = nft, Engine(writers, self._delete_conntrack, self.clock)
        return self._engine

    def writers(self) -> list[NftablesFamily]:
        """Each family's part of a sync (sets up the kernel port on first use)."""
        return [cast(NftablesFamily, f.writer) for f in self._setup().families]

    def programmed(self, family: IPFamily) -> Rendered | None:
        """The table pyproxy last wrote (or tried to) for ``family``."""
        return self._engine.programmed(family) if self._engine else None

    def drifted(self) -> bool:
        """Someone deleted pyproxy's table: only a full sync brings it back."""
        if self._nft is None or self._engine is None:
            return False
        present = self._nft.tables()
        return any((cast(NftablesFamily, w).cfg.nft_family, TABLE) not in present
                   for w, _ in self._engine.trusted())  # fmt: skip

    # ---- sync -------------------------------------------------------------------------------

    def sync(self, request: SyncRequest) -> SyncResult:
        start = time.monotonic()
        return self.sync_rules(request, with_local_addresses(request.state, self.proxy), start)

    def sync_rules(self, request: SyncRequest, state: ProxyState, start: float) -> SyncResult:
        """The table's part of a sync, for ``state`` with this host's addresses already
        added (ebpf mode reads them once for its map and its rules)."""
        engine = self._setup()
        result = engine.sync(state, request)
        self._serve_localhost(state, None if result.full else request.changed)
        if self.metrics is not None:
            self.metrics.durations.observe(result.full, time.monotonic() - start,
                                           result.families)  # fmt: skip
        return result

    def sync_failed(self, family: IPFamily) -> None:
        if self.metrics is not None:
            self.metrics.sync_failures.labels(family.value).inc()

    def cleanup_failed(self, family: IPFamily) -> None:
        if self.metrics is not None:
            self.metrics.cleanup_failures.labels(family.value).inc()

    def _serve_localhost(
        self, state: ProxyState, changed: Collection[NamespacedName] | None
    ) -> None:
        """Localhost NodePorts' listeners follow the sync; one that cannot bind is logged and
        counted, never fails the sync (upstream's SyncNodePorts)."""
        if not self.localhost.families:
            return
        self.localhost.update(state, changed)
        m = self.metrics
        if m is None or m.listeners is None or m.listener_failures is None:
            return
        for family in self.localhost.families:
            m.listeners.labels(family.value).set(self.localhost.listening(family))
        for key in self.localhost.failed:
            m.listener_failures.labels(key.split("/", 1)[0]).inc()

    def close(self) -> None:
        self.localhost.close()

    # ---- cleanup ----------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Delete pyproxy's kube-proxy tables (ip and ip6), and nothing else."""
        nft = self._port or Nft()
        reason = nft.usable()
        if reason is not None:
            raise BackendError(reason)
        present = nft.tables()
        for cfg in self.configs.values():
            if (cfg.nft_family, TABLE) in present:
                try:
                    nft.run(f"delete table {cfg.nft_family} {TABLE}\n")
                except NftError as err:
                    raise BackendError(f"cannot delete {cfg.nft_family} {TABLE}: {err}") from None
