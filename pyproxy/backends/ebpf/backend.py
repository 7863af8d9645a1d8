"""ebpf mode: nftables mode's table for every path, plus socket-level balancing for what
starts on the node (Cilium's "hybrid": kube-proxy's rules stay, and a process in the
programs' cgroup is connected straight to an endpoint, so its packets reach the rules already
addressed to a pod and are not translated twice).

Two engines, one per kind of kernel object, run the same sync: the nftables one (the whole of
nftables mode) and one for the socket map, whose per-family writers write only the changed
services' entries. The map comes first: it is what a change is measured by in this mode
(written in microseconds, where the nftables transaction takes tens of milliseconds at
10,000 services), and neither order leaves a connection unserved in between: a balanced
connection goes straight to a pod address, which needs no service rule, and an entry removed
first leaves its service to the rules, which still hold it until their own write.
"""

from __future__ import annotations

import logging
import os
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from pyproxy.backends.base import (
    BackendError,
    BackendUnavailable,
    Difference,
    ServiceTraffic,
    SyncRequest,
    SyncResult,
    by_service_port,
    per_service,
)
from pyproxy.backends.ebpf import layout
from pyproxy.backends.ebpf.programs import SocketPrograms, pin_dir
from pyproxy.backends.ebpf.render import Balanced, hostport
from pyproxy.backends.ebpf.table import SocketCache, SocketTable
from pyproxy.backends.ebpf.writer import SocketFamily, SocketMaps
from pyproxy.backends.engine.engine import DeleteConntrack, Engine
from pyproxy.backends.local_addresses import with_local_addresses
from pyproxy.backends.nftables.backend import NftablesBackend
from pyproxy.backends.stale_conntrack import Filter
from pyproxy.backends.trace import AFFINITY_NOTE, SOCKET, Outcome, Packet, Trace
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import bpf_mounts, conntrack
from pyproxy.kernel.bpf import BpfError, Map
from pyproxy.kernel.nft import Nft
from pyproxy.model.types import Endpoint, IPAddress, IPFamily, Protocol, ProxyState

log = logging.getLogger(__name__)


class SocketMapWrites(Collector):
    """``pyproxy_socket_map_write_seconds{kind}`` and
    ``pyproxy_socket_map_seen_to_written_seconds``: the last full and partial writes of the
    socket map, and how long after pyproxy saw the last change its entries were in the map
    (what the benchmark reads: cheaper than /debug/state, which holds every service)."""

    def __init__(self, writes: Callable[[], Sequence[dict[str, Any]]]) -> None:
        self.writes = writes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        took = GaugeMetricFamily("pyproxy_socket_map_write_seconds",
                                 "Duration of the last socket map write, full or partial",
                                 labels=("kind",))  # fmt: skip
        seen = GaugeMetricFamily("pyproxy_socket_map_seen_to_written_seconds",
                                 "From pyproxy seeing the last change to its entries being in "
                                 "the socket map")  # fmt: skip
        last: dict[str, float] = {}
        latency = None
        for w in self.writes():
            last["full" if w["full"] else "partial"] = w["seconds"]
            if w["seenToMapSeconds"] is not None and not w["full"]:
                latency = w["seenToMapSeconds"]
        for kind, value in sorted(last.items()):
            took.add_metric((kind,), value)
        if latency is not None:
            seen.add_metric((), latency)
        yield from (took, seen)


class CountsMap(typing.Protocol):
    def lookup_percpu(self, key: bytes) -> list[bytes] | None: ...


def _no_conntrack(filters: Sequence[Filter], ipv6: bool) -> int:
    """The socket engine's conntrack port: the nftables engine clears stale flows once."""
    return 0


class EbpfBackend(NftablesBackend):
    mode = "ebpf"

    def __init__(
        self,
        cfg: ProxyConfig,
        nft: Nft | None = None,
        delete_conntrack: DeleteConntrack = conntrack.delete,
        clock: Callable[[], float] = time.monotonic,
        maps: SocketMaps | None = None,
        counts: CountsMap | None = None,
    ) -> None:
        """``maps``, ``counts``: the socket map ports (default: the programs attached to
        ``--bpf-cgroup`` and their pinned maps)."""
        super().__init__(cfg, nft, delete_conntrack, clock)
        self._maps = maps
        self._counts = counts
        self._sockets: Engine[SocketTable] | None = None
        self._socket_writes: tuple[dict[str, Any], ...] = ()
        """The last 8 syncs' socket-map writes (/debug/state: what the benchmark reads; a
        new tuple each time, so the HTTP thread reads it without a lock)."""

    def programs(self) -> SocketPrograms:
        cgroup = str(self.proxy.option("bpf_cgroup", "") or bpf_mounts.cgroup2_root() or "")
        return SocketPrograms(cgroup, pin_dir(self.proxy))

    def prepare(self) -> None:
        super().prepare()
        self._socket_engine()

    def _socket_engine(self) -> Engine[SocketTable]:
        if self._sockets is None:
            maps = self._maps
            if maps is None:
                programs = self.programs()
                if not programs.cgroup:
                    raise BackendUnavailable("--mode=ebpf: no cgroup v2 hierarchy is mounted")
                reason = programs.unusable()
                if reason is not None:
                    raise BackendUnavailable(f"--mode=ebpf: {reason}")
                try:
                    services, members, self._counts = programs.open()
                    maps = SocketMaps(services, members)
                except (BpfError, OSError) as err:
                    raise BackendUnavailable(f"--mode=ebpf: {err}") from None
            families = [w.family for w in self.writers()]
            writers = [SocketFamily(f, maps, self.proxy) for f in families]
            self._sockets = Engine(writers, _no_conntrack, self.clock)
        return self._sockets

    def register_metrics(self, registry: CollectorRegistry) -> None:
        super().register_metrics(registry)
        registry.register(SocketMapWrites(lambda: self._socket_writes))

    def debug_state(self) -> dict[str, Any]:
        """nftables mode's facts, and the last socket-map writes: how long each took and,
        for a change, how long after pyproxy saw it its entries were in the map."""
        return {**super().debug_state(), "socketMapWrites": list(self._socket_writes)}

    def socket_table(self, family: IPFamily) -> SocketTable | None:
        return self._sockets.programmed(family) if self._sockets else None

    def sync(self, request: SyncRequest) -> SyncResult:
        """The map, then the rules; a map the kernel refuses (full, say) does not keep the
        rules from their sync: they serve every service meanwhile, and the error is raised
        after them, so the next sync is full and writes the map again."""
        t0 = self.clock()
        state = with_local_addresses(request.state, self.proxy)  # the NodePorts' own
        try:
            sockets = self._socket_engine().sync(state, request)
        except BackendError as err:
            self.sync_rules(request, state, time.monotonic())
            raise BackendError(f"{err} (the nftables rules were synced)") from None
        t1 = self.clock()
        write = {"full": sockets.full, "seconds": round(t1 - t0, 6),
                 "seenToMapSeconds": None if request.first_seen is None
                 else round(t1 - request.first_seen, 6)}  # fmt: skip
        self._socket_writes = (*self._socket_writes[-7:], write)  # replaced, never mutated
        rules = self.sync_rules(request, state, time.monotonic())
        return SyncResult(
            full=rules.full or sockets.full,
            families=rules.families,
            render_seconds=rules.render_seconds + sockets.render_seconds,
            apply_seconds=rules.apply_seconds + sockets.apply_seconds,
            no_local_endpoints=rules.no_local_endpoints,
            sync_again_in=rules.sync_again_in,
            reason=rules.reason or sockets.reason,
        )

    def render(self, state: ProxyState) -> str:
        """nftables mode's transactions, then the socket map's intended entries."""
        parts = [super().render(state)]
        for family in (IPFamily.IPV4, IPFamily.IPV6):
            table = SocketCache(family, self.proxy).render(state)
            lines = [b.text for b in table.balanced()]
            if lines:
                head = f"# {family.value}: balanced at the socket\n"
                parts.append(head + "\n".join(lines) + "\n")
        return "".join(parts)

    def compare(self, state: ProxyState) -> list[Difference]:
        """nftables mode's differences, then the socket map's entries against the render."""
        out = super().compare(state)
        want: dict[str, str] = {}  # line -> service
        for family in (IPFamily.IPV4, IPFamily.IPV6):
            for b in SocketCache(family, self.proxy).render(state).balanced():
                svc = b.name.split(":", 1)[0]
                want.update({layout.describe(k, v): svc for k, v in b.entries().items()})
        path = os.path.join(self.programs().pin_dir, "services")
        try:
            with Map.open(path) as m:
                have = {layout.describe(k, v) for k, v in m.items().items()}
        except (BpfError, OSError) as err:
            raise BackendError(f"cannot read the socket map {path}: {err}") from None
        by_front = {line.split(" slot ", 1)[0]: svc for line, svc in want.items()}

        def service_of(line: str) -> str:
            return by_front.get(line.split(" slot ", 1)[0], "")

        missing = sorted(line for line in want if line not in have)
        unexpected = sorted(line for line in have if line not in want)
        return out + per_service("socket map services", missing, unexpected, service_of)

    def service_traffic(self) -> dict[str, ServiceTraffic]:
        """Connections the programs sent to an endpoint (UDP: datagrams), per service port,
        plus what the rules counted with ``--service-metrics`` (traffic from outside the
        cluster and whatever the socket map does not hold)."""
        try:
            counted = list(super().service_traffic().items())
        except BackendUnavailable:
            counted = []
        names: dict[int, str] = {}
        for family in (IPFamily.IPV4, IPFamily.IPV6):
            table = self.socket_table(family)
            if table is not None:
                names.update((b.ident, b.name) for b in table.balanced())
        if self._counts is not None:
            for ident, name in names.items():
                try:
                    values = self._counts.lookup_percpu(layout.count_key(ident))
                except (BpfError, OSError) as err:
                    raise BackendError(f"cannot read the socket counts: {err}") from None
                if values is not None:
                    counted.append((name, ServiceTraffic(layout.total(values))))
        return by_service_port(counted)

    def trace(self, state: ProxyState, packet: Packet) -> Trace:
        """A client in the cluster (a pod, by ``--cluster-cidr``, or this node's own address)
        connecting to an address balanced at the socket: the program's choice, each endpoint
        with an equal share; anything else (a client outside the cluster, an address the map
        does not hold, a connect()ed UDP socket) takes nftables mode's rules."""
        family, src = packet.family, packet.src
        inside = src in state.node.local_addresses or any(
            src in cidr for cidr in self.proxy.local_cidrs(state.node, family)
        )

        def index() -> dict[tuple[IPAddress, int, Protocol], Balanced]:
            table = SocketCache(family, self.proxy).render(state)
            return {(b.addr, b.port, b.protocol): b for b in table.balanced()}

        key = (packet.dst, packet.port, packet.protocol)
        balanced = self.walker(state, family, index, kind="socket").get(key) if inside else None
        if balanced is None:
            return Trace(packet, self.mode, super().trace(state, packet).outcomes)
        hook = ("connect" if packet.protocol is Protocol.TCP else "sendmsg") + family.value[-1]
        front = f"{hostport(packet.dst, packet.port)}/{packet.protocol.value.lower()}"
        n = len(balanced.endpoints)
        notes = [f"a process in the cgroup {hook} is attached to; "
                 "a packet from outside the cluster takes the nftables rules"]  # fmt: skip
        if packet.protocol is Protocol.UDP:
            notes.append("an unconnected UDP socket keeps its endpoint for its life; a "
                         "connect()ed one is left to the rules")  # fmt: skip
        if balanced.affinity_timeout:
            notes.append(AFFINITY_NOTE)
        head = f"{hook} program: services map {front} slot 0 ({n} endpoint{'s' * (n != 1)})"

        def chosen(slot: int, ep: Endpoint) -> Outcome:
            step = f"{hook} program: services map {front} slot {slot}: {ep.hostport}"
            return Outcome(SOCKET, 1 / n, ep.hostport, False, (head, step), tuple(notes))

        return Trace(packet, self.mode, tuple(chosen(i, ep) for i, ep in
                                              enumerate(balanced.endpoints, 1)))  # fmt: skip

    def cleanup(self) -> None:
        """nftables mode's tables, and the programs, links and maps pinned in the pin
        directory."""
        super().cleanup()
        try:
            n = self.programs().remove()
        except BpfError as err:
            raise BackendError(str(err)) from None
        if n:
            log.info("removed %d pinned socket programs and maps", n)
