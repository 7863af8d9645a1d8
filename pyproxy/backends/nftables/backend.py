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
from dataclasses import dataclass, field

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
from pyproxy.backends.nftables.walk import Walker
from pyproxy.backends.stale_conntrack import stale_filters
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


@dataclass
class _Family:
    cfg: NftConfig
    renderer: Renderer
    mirror: tx.Mirror = field(default_factory=tx.Mirror)
    programmed: Rendered | None = None
    trusted: bool = False
    last_state: ProxyState | None = None

    @property
    def family(self) -> IPFamily:
        return self.cfg.family


class NftablesBackend(Backend):
    mode = "nftables"

    def __init__(self, cfg: ProxyConfig) -> None:
        self.proxy = cfg
        self.configs = {f: NftConfig(family=f, proxy=cfg) for f in FAMILIES}
        self._nft: Nft | None = None
        self._families: list[_Family] | None = None
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
        for fam in self._families or ():
            owners = fam.programmed.service_counters() if fam.programmed else {}
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
            r = Renderer(self.configs[family]).full(state)
            parts.append(
                f"# {family.value}: input for nft -f\n" + tx.full(r, tx.Mirror(), (), (), 0)
            )
        return "".join(parts)

    def compare(self, state: ProxyState) -> list[Difference]:
        state = with_local_addresses(state, self.proxy)
        out: list[Difference] = []
        for family in FAMILIES:
            cfg = self.configs[family]
            r = Renderer(cfg).full(state)
            out += nft_compare(cfg.nft_family, TABLE, tx.full(r, tx.Mirror(), (), (), 0))
        return out

    def trace(self, state: ProxyState, packet: Packet) -> Trace:
        def make() -> Walker:
            r = Renderer(self.configs[packet.family]).full(state)
            return Walker(tx.full(r, tx.Mirror(), (), (), 0), state.node.local_addresses)

        walker = self.walker(state, packet.family, make)
        return Trace(packet, self.mode, tuple(walker.walk(packet)))

    # ---- set-up ---------------------------------------------------------------------------

    def prepare(self) -> None:
        self._setup()

    def _setup(self) -> tuple[Nft, list[_Family]]:
        if self._nft is None or self._families is None:
            nft = Nft()
            reason = nft.usable()
            if reason is not None:
                raise BackendUnavailable(f"--mode=nftables: {reason}")
            fams = []
            for cfg in self.configs.values():
                probe = f"table {cfg.nft_family} pyproxy-probe"
                try:
                    nft.run(f"add {probe}\ndelete {probe}\n")
                except NftError as err:
                    log.warning("nftables family %s does not work here (%s)", cfg.nft_family, err)
                    continue
                fams.append(_Family(cfg, Renderer(cfg)))
            log.info(
                "nftables mode: %s, families %s", nft.how, ", ".join(f.family.value for f in fams)
            )
            self._nft, self._families = nft, fams
        return self._nft, self._families

    def drifted(self) -> bool:
        """Someone deleted pyproxy's table: only a full sync brings it back."""
        if self._nft is None or not self._families:
            return False
        present = self._nft.tables()
        return any(
            f.programmed is not None and (f.cfg.nft_family, TABLE) not in present
            for f in self._families
        )

    # ---- sync -------------------------------------------------------------------------------

    def sync(self, request: SyncRequest) -> SyncResult:
        start = time.monotonic()
        nft, fams = self._setup()
        state = with_local_addresses(request.state, self.proxy)
        times = [0.0, 0.0]
        did_full = False
        no_local: dict[tuple[str, IPFamily], int] = {}
        for fam in fams:
            full = self._sync_family(nft, fam, state, request, times)
            did_full = did_full or full
            assert fam.programmed is not None
            for policy, n in fam.programmed.no_local.items():
                no_local[(policy, fam.family)] = n
            self._clear_conntrack(fam, state, None if full else request.changed)
            fam.last_state = state
        self._serve_localhost(state, None if did_full else request.changed)
        families = tuple(f.family for f in fams)
        if self.metrics is not None:
            self.metrics.durations.observe(did_full, time.monotonic() - start, families)
        pending = [t for f in fams for t in f.mirror.stale_chains.values()]
        again = (
            max(0.0, min(pending) + tx.STALE_CHAIN_DELAY - time.monotonic()) if pending else None
        )
        return SyncResult(did_full, families, times[0], times[1], no_local, again)

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

    def _sync_family(
        self, nft: Nft, fam: _Family, state: ProxyState, request: SyncRequest, times: list[float]
    ) -> bool:
        """True when this family had a full sync."""
        now = time.monotonic()
        full = request.full or fam.programmed is None or not fam.trusted
        if not full and not self._delete_stale(nft, fam, now):
            full = True
        if not full and fam.programmed is not None:
            t0 = time.monotonic()
            updates = fam.renderer.updates(state, request.changed, fam.programmed)
            t1 = time.monotonic()
            times[0] += t1 - t0
            if updates is None:
                log.info("%s: the node's facts or the service CIDRs changed", fam.family.value)
            else:
                try:
                    self._partial(nft, fam, fam.programmed, updates, now)
                    return False
                except BackendError as err:
                    log.warning("partial sync failed (%s); doing a full sync", err)
                finally:
                    times[1] += time.monotonic() - t1
        t0 = time.monotonic()
        new = fam.renderer.full(state, fam.programmed)
        t1 = time.monotonic()
        try:
            self._full(nft, fam, new, now)
        finally:
            times[0] += t1 - t0
            times[1] += time.monotonic() - t1
        return True

    def _run(self, nft: Nft, fam: _Family, text: str, fresh: bool = False) -> None:
        try:
            with self.transactions.applying(f"{fam.family.value} nftables transaction", text):
                nft.run(text, fresh=fresh)
        except NftError as err:
            fam.trusted = False
            if self.metrics is not None:
                self.metrics.sync_failures.labels(fam.family.value).inc()
            raise BackendError(f"{fam.family.value} nftables transaction failed: {err}") from None

    def _partial(
        self, nft: Nft, fam: _Family, programmed: Rendered, updates: Updates, now: float
    ) -> None:
        text, touched = tx.partial(programmed, updates, fam.mirror, now)
        if text:
            self._run(nft, fam, text)
        tx.written_after_partial(programmed, touched, fam.mirror)

    def _full(self, nft: Nft, fam: _Family, new: Rendered, now: float) -> None:
        try:
            existing = nft.names(fam.cfg.nft_family, TABLE)
        except NftError as err:
            raise BackendError(
                f"cannot list the {fam.cfg.nft_family} {TABLE} table: {err}"
            ) from None
        try:
            counters = [n for n in nft.counters(fam.cfg.nft_family, TABLE) if is_service_counter(n)]
        except NftError as err:
            raise BackendError(f"cannot list the {fam.cfg.nft_family} counters: {err}") from None
        text = tx.full(new, fam.mirror, existing["chain"], existing["set"], now, existing["map"],
                       counters)  # fmt: skip
        fam.programmed, fam.trusted = new, False
        self._run(nft, fam, text, fresh=new.rule_count() > FRESH_PROCESS_RULES)
        tx.written_after_full(new, fam.mirror)
        fam.trusted = True

    def _delete_stale(self, nft: Nft, fam: _Family, now: float) -> bool:
        """Delete chains flushed long enough ago; False (and a full sync) if that failed."""
        assert fam.programmed is not None
        text, due = tx.stale_deletions(fam.programmed, fam.mirror, now)
        if not text:
            return True
        try:
            nft.run(text)
        except NftError as err:
            log.warning("cannot delete %d stale chains (%s); syncing fully", len(due), err)
            if self.metrics is not None:
                self.metrics.cleanup_failures.labels(fam.family.value).inc()
            return False
        for chain in due:
            fam.mirror.stale_chains.pop(chain, None)
        log.info("deleted %d stale chains (%s)", len(due), fam.family.value)
        return True

    def _clear_conntrack(
        self, fam: _Family, state: ProxyState, changed: Collection[NamespacedName] | None
    ) -> None:
        filters = stale_filters(fam.last_state, state, fam.family, changed)
        if filters:
            n = conntrack.delete(filters, ipv6=fam.family is IPFamily.IPV6)
            log.info("cleared %d stale UDP conntrack entries (%s)", n, fam.family.value)

    def close(self) -> None:
        self.localhost.close()

    # ---- cleanup ----------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Delete pyproxy's kube-proxy tables (ip and ip6), and nothing else."""
        nft = Nft()
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
