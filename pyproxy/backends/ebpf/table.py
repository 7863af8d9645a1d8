"""One family's socket-balancing entries as pyproxy wrote them, per service, on the engine's
per-service cache: a sync renders again only the services whose ports or endpoints changed,
and writes only their entries. Pure: nothing here touches the kernel."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from pyproxy.backends.ebpf.render import Balanced, render_port
from pyproxy.backends.engine.cache import Entry, ServiceCache, ServiceTable
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    IPFamily,
    NamespacedName,
    NodeInfo,
    ProxyState,
    ServicePort,
)


@dataclass(slots=True)
class SocketObjects:
    """What one service (all its ports) balances at the socket."""

    balanced: tuple[Balanced, ...] = ()
    no_local_internal: int = 0
    """Always 0: the rules' engine counts the service (its nftables objects), once."""
    no_local_external: int = 0

    def entries(self) -> dict[bytes, bytes]:
        return _merged(self.balanced, Balanced.entries)

    def members(self) -> dict[bytes, bytes]:
        return _merged(self.balanced, Balanced.members)


def _merged(
    balanced: Iterable[Balanced], part: Callable[[Balanced], dict[bytes, bytes]]
) -> dict[bytes, bytes]:
    """One map's entries (``Balanced.entries`` or ``.members``) of several addresses."""
    return {k: v for b in balanced for k, v in part(b).items()}


SocketEntry = Entry[SocketObjects]
Updates = Mapping[NamespacedName, SocketEntry | None]


class SocketTable(ServiceTable[SocketObjects]):
    """A family's balanced service addresses: what the ``services`` map holds for it."""

    def balanced(self) -> Iterator[Balanced]:
        for svc in sorted(self.entries):
            yield from self.entries[svc].objects.balanced

    def _all(self) -> Iterator[Balanced]:
        """Every balanced address, in no particular order (``balanced`` sorts, for render)."""
        for entry in self.entries.values():
            yield from entry.objects.balanced

    def entries_written(self) -> dict[bytes, bytes]:
        return _merged(self._all(), Balanced.entries)

    def members_written(self) -> dict[bytes, bytes]:
        return _merged(self._all(), Balanced.members)


class Facts(NamedTuple):
    """What every service's entries depend on: the node (its name and zone decide the local
    and topology-hinted endpoints) and its addresses that serve NodePorts."""

    node: NodeInfo
    nodeport_ips: tuple[IPAddress, ...]


class SocketCache(ServiceCache[SocketObjects, Facts, SocketTable]):
    """Renders one family's balanced addresses, reusing a service's while its inputs are the
    same (``Facts``: a change to them renders every service again)."""

    def __init__(self, family: IPFamily, cfg: ProxyConfig) -> None:
        nodeports = cfg.nodeport_addresses
        affinity = bool(cfg.option("bpf_socket_affinity", False))

        def facts(state: ProxyState, endpoints: int) -> Facts:
            return Facts(state.node, nodeports.listed_ips(state.node, family))

        def render(
            ports: tuple[ServicePort, ...], eps: tuple[tuple[Endpoint, ...], ...], f: Facts
        ) -> SocketObjects:
            return SocketObjects(tuple(
                b for sp, e in zip(ports, eps, strict=True)
                for b in render_port(sp, e, f.node, family, f.nodeport_ips, affinity)))  # fmt: skip

        super().__init__(family, facts, render)

    def table(
        self, state: ProxyState, facts: Facts, entries: Mapping[NamespacedName, SocketEntry]
    ) -> SocketTable:
        return SocketTable(facts, entries)
