"""IPVS mode's desired state for one family, kept per service on the engine's cache, so that a
partial sync renders only the changed services and knows exactly which virtual servers,
``kube-ipvs0`` addresses and ipset entries differ. Pure: nothing here touches the kernel.

Several services can want the same thing: an ipset entry (two services with an endpoint on
the same pod port put the same KUBE-LOOP-BACK entry), an address (an external IP shared by
services on different ports), even a virtual server (two services claiming one external IP
and port). Addresses and entries are counted, and leave only with their last user; a virtual
server several services want is the one of the last service in name order, which is what a
render walking the services in order and overwriting would give. ``render`` is this table
built in one go, so a full and a partial sync agree by construction.

``IpvsTable.delta`` works out what a set of updates changes without changing the table: the
engine applies the updates only once the kernel took them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from pyproxy.backends.engine.cache import Entry, ServiceCache, ServiceTable
from pyproxy.backends.ipvs.render import (
    Desired,
    IpvsConfig,
    VirtualServer,
    VSKey,
    family_sets,
    iptables_rules,
    nodeport_ips,
    render_service,
)
from pyproxy.backends.ipvs.render import Entry as SetEntry
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    NamespacedName,
    NodeInfo,
    ProxyState,
    ServicePort,
)

H = TypeVar("H", bound=Hashable)

ServiceEntry = Entry[Desired]
Updates = Mapping[NamespacedName, ServiceEntry | None]


@dataclass(frozen=True)
class Facts:
    """What every service's virtual servers depend on besides its own ports and endpoints."""

    node: NodeInfo
    node_ips: tuple[IPAddress, ...]
    """The addresses that get a virtual server per NodePort."""


@dataclass
class Delta:
    """What a partial sync must write: the virtual servers whose wanted form changed (their
    new form in ``wanted``, None: no longer wanted), and the addresses and entries that came
    or went."""

    wanted: dict[VSKey, VirtualServer | None] = field(default_factory=dict)
    add_addresses: set[str] = field(default_factory=set)
    delete_addresses: set[str] = field(default_factory=set)
    ipset_add: dict[str, set[SetEntry]] = field(default_factory=dict)
    ipset_delete: dict[str, set[SetEntry]] = field(default_factory=dict)

    @property
    def services(self) -> set[VSKey]:
        return set(self.wanted)

    def empty(self) -> bool:
        return not (
            self.wanted
            or self.add_addresses
            or self.delete_addresses
            or any(self.ipset_add.values())
            or any(self.ipset_delete.values())
        )


class IpvsTable(ServiceTable[Desired]):
    """One family's services as rendered, with who wants each virtual server, address and
    ipset entry."""

    def __init__(
        self, cfg: IpvsConfig, facts: Facts, entries: Mapping[NamespacedName, ServiceEntry]
    ) -> None:
        self.cfg = cfg
        self.owners: dict[VSKey, set[NamespacedName]] = {}
        self.address_refs: Counter[str] = Counter()
        self.set_refs: dict[str, Counter[SetEntry]] = {
            n: Counter() for n in family_sets(cfg.family)
        }
        super().__init__(facts, entries)
        self.facts: Facts = facts
        self.iptables = iptables_rules(facts.node, cfg)
        """The few iptables rules of IPVS mode (they depend on the node only)."""
        self.real_servers = sum(len(self._winner(k).dests) for k in self.owners)

    @property
    def node(self) -> NodeInfo:
        return self.facts.node

    def _count(self, svc: NamespacedName, entry: ServiceEntry, sign: int) -> None:
        super()._count(svc, entry, sign)
        d = entry.objects
        for key in d.services:
            if sign > 0:
                self.owners.setdefault(key, set()).add(svc)
            else:
                self.owners[key].discard(svc)
                if not self.owners[key]:
                    del self.owners[key]
        _add(self.address_refs, d.addresses, sign)
        for name, items in d.ipsets.items():
            _add(self.set_refs.setdefault(name, Counter()), items, sign)

    def _winner(self, key: VSKey) -> VirtualServer:
        return self.entries[max(self.owners[key])].objects.services[key]

    def virtual_server(self, key: VSKey) -> VirtualServer | None:
        return self._winner(key) if key in self.owners else None

    def virtual_server_after(self, key: VSKey, updates: Updates) -> VirtualServer | None:
        """``key``'s wanted form once ``updates`` are applied (the table is not changed)."""
        owners = {o for o in self.owners.get(key, ()) if o not in updates}
        owners |= {svc for svc, e in updates.items() if e is not None and key in e.objects.services}
        if not owners:
            return None
        winner = max(owners)
        entry = updates[winner] if winner in updates else self.entries[winner]
        assert entry is not None
        return entry.objects.services[key]

    def _affected(self, updates: Updates) -> set[VSKey]:
        keys: set[VSKey] = set()
        for svc, new in updates.items():
            old = self.entries.get(svc)
            keys |= (old.objects.services.keys() if old else set()) | (
                new.objects.services.keys() if new else set()
            )
        return keys

    def delta(self, updates: Updates) -> Delta:
        """What applying ``updates`` changes: virtual servers whose winner's form differs,
        and addresses and ipset entries whose first user came or last user left (one that
        leaves and comes back within the updates is neither)."""
        out = Delta()
        for key in sorted(self._affected(updates)):
            now = self.virtual_server_after(key, updates)
            if now != self.virtual_server(key):
                out.wanted[key] = now
        addresses: Counter[str] = Counter()
        sets: dict[str, Counter[SetEntry]] = {}
        for svc, new in updates.items():
            old = self.entries.get(svc)
            before = old.objects if old else Desired(ipsets={})
            after = new.objects if new else Desired(ipsets={})
            _net(addresses, before.addresses, after.addresses)
            for name in before.ipsets.keys() | after.ipsets.keys():
                _net(sets.setdefault(name, Counter()),
                     before.ipsets.get(name, ()), after.ipsets.get(name, ()))  # fmt: skip
        _came_went(self.address_refs, addresses, out.add_addresses, out.delete_addresses)
        for name, net in sets.items():
            _came_went(self.set_refs.get(name, Counter()), net,
                       out.ipset_add.setdefault(name, set()),
                       out.ipset_delete.setdefault(name, set()))  # fmt: skip
        return out

    def apply(self, updates: Updates) -> None:
        affected = self._affected(updates)
        before = sum(len(vs.dests) for k in affected if (vs := self.virtual_server(k)))
        super().apply(updates)
        self.real_servers += (
            sum(len(vs.dests) for k in affected if (vs := self.virtual_server(k))) - before
        )

    def desired(self) -> Desired:
        """The whole family, as a full sync writes it."""
        d = Desired(ipsets={n: set(c) for n, c in self.set_refs.items()})
        for key in sorted(self.owners):
            d.services[key] = self._winner(key)
        d.addresses = set(self.address_refs)
        d.no_local_internal = self.no_local["internal"]
        d.no_local_external = self.no_local["external"]
        d.iptables = self.iptables
        return d


def _add(refs: Counter[H], items: Iterable[H], sign: int) -> None:
    for item in items:
        refs[item] += sign
        if refs[item] <= 0:
            del refs[item]


def _net(net: Counter[H], before: Iterable[H], after: Iterable[H]) -> None:
    b, a = set(before), set(after)
    for item in b - a:
        net[item] -= 1
    for item in a - b:
        net[item] += 1


def _came_went(refs: Counter[H], net: Counter[H], came: set[H], went: set[H]) -> None:
    for item, n in net.items():
        have = refs.get(item, 0)
        if have == 0 and n > 0:
            came.add(item)
        elif have > 0 and have + n <= 0:
            went.add(item)


class IpvsCache(ServiceCache[Desired, Facts, IpvsTable]):
    """Renders one family's virtual servers, reusing each service's while its inputs are the
    same."""

    def __init__(self, cfg: IpvsConfig) -> None:
        def facts(state: ProxyState, endpoints: int) -> Facts:
            return Facts(state.node, nodeport_ips(state.node, cfg))

        def render(
            ports: tuple[ServicePort, ...], eps: tuple[tuple[Endpoint, ...], ...], f: Facts
        ) -> Desired:
            return render_service(ports, eps, f.node, cfg, f.node_ips)

        super().__init__(cfg.family, facts, render)
        self.cfg = cfg

    def table(
        self, state: ProxyState, facts: Facts, entries: Mapping[NamespacedName, ServiceEntry]
    ) -> IpvsTable:
        return IpvsTable(self.cfg, facts, entries)


def render(state: ProxyState, cfg: IpvsConfig) -> Desired:
    """Everything one family wants: every service's part, and the fixed iptables rules."""
    return IpvsCache(cfg).render(state).desired()
