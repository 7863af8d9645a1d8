"""IPVS mode's desired state for one family, kept per service, so that a partial sync renders
only the changed services and knows exactly which virtual servers, ``kube-ipvs0`` addresses
and ipset entries differ. Pure: nothing here touches the kernel.

Several services can want the same thing: an ipset entry (two services with an endpoint on
the same pod port put the same KUBE-LOOP-BACK entry), an address (an external IP shared by
services on different ports), even a virtual server (two services claiming one external IP
and port). Addresses and entries are counted, and leave only with their last user; a virtual
server several services want is the one of the last service in name order, which is what a
render walking the services in order and overwriting would give. ``render`` is this table
built in one go, so a full and a partial sync agree by construction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from pyproxy.backends.ipvs.render import (
    Desired,
    Entry,
    IpvsConfig,
    VirtualServer,
    VSKey,
    family_sets,
    iptables_text,
    nodeport_ips,
    render_service,
)
from pyproxy.model.types import NamespacedName, NodeInfo, ProxyState

T = TypeVar("T", bound=Hashable)


@dataclass(frozen=True)
class Part:
    """One service's share of the desired state, and what it was rendered from."""

    key: tuple[object, ...]
    desired: Desired


@dataclass
class Delta:
    """What a partial sync must write: the virtual servers whose wanted form changed (their
    new form is ``Table.virtual_server``), and the addresses and entries that came or went."""

    services: set[VSKey] = field(default_factory=set)
    add_addresses: set[str] = field(default_factory=set)
    delete_addresses: set[str] = field(default_factory=set)
    ipset_add: dict[str, set[Entry]] = field(default_factory=dict)
    ipset_delete: dict[str, set[Entry]] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (
            self.services
            or self.add_addresses
            or self.delete_addresses
            or any(self.ipset_add.values())
            or any(self.ipset_delete.values())
        )


class Table:
    def __init__(self, cfg: IpvsConfig, node: NodeInfo) -> None:
        self.cfg = cfg
        self.node = node
        self.node_ips = nodeport_ips(node, cfg)
        self.parts: dict[NamespacedName, Part] = {}
        self.owners: dict[VSKey, set[NamespacedName]] = {}
        self.address_refs: Counter[str] = Counter()
        self.set_refs: dict[str, Counter[Entry]] = {n: Counter() for n in family_sets(cfg.family)}
        self.no_local: Counter[str] = Counter(internal=0, external=0)
        self.real_servers = 0
        self.renders = 0
        """Services rendered since the table was built (tests count them)."""

    @classmethod
    def build(cls, state: ProxyState, cfg: IpvsConfig) -> Table:
        table = cls(cfg, state.node)
        table.update(state, state.service_names())
        return table

    def fits(self, state: ProxyState) -> bool:
        """False when the node's facts changed: every service may render differently."""
        return state.node == self.node

    def update(self, state: ProxyState, changed: Iterable[NamespacedName]) -> Delta:
        delta = Delta()
        for name in sorted(changed):
            ports = tuple(state.ports_of(name, self.cfg.family))
            old = self.parts.get(name)
            new: Part | None = None
            if ports:
                key = (ports, tuple(state.endpoints_for(p.name, self.cfg.family) for p in ports))
                if old is not None and old.key == key:
                    continue
                self.renders += 1
                new = Part(key, render_service(ports, state, self.cfg, self.node_ips))
            if old is not None or new is not None:
                self._replace(name, old, new, delta)
        return delta

    def virtual_server(self, key: VSKey) -> VirtualServer | None:
        owners = self.owners.get(key)
        return self.parts[max(owners)].desired.services[key] if owners else None

    def _replace(
        self, name: NamespacedName, old: Part | None, new: Part | None, delta: Delta
    ) -> None:
        before = old.desired if old else Desired(ipsets={})
        after = new.desired if new else Desired(ipsets={})
        affected = before.services.keys() | after.services.keys()
        was = {key: self.virtual_server(key) for key in affected}
        if new is None:
            del self.parts[name]
        else:
            self.parts[name] = new
        for key in before.services.keys() - after.services.keys():
            self.owners[key].discard(name)
            if not self.owners[key]:
                del self.owners[key]
        for key in after.services:
            self.owners.setdefault(key, set()).add(name)
        for key in affected:
            now, then = self.virtual_server(key), was[key]
            if now != then:
                delta.services.add(key)
                self.real_servers += (len(now.dests) if now else 0) - (
                    len(then.dests) if then else 0
                )
        _count(self.address_refs, before.addresses, after.addresses,
               delta.add_addresses, delta.delete_addresses)  # fmt: skip
        for set_name in before.ipsets.keys() | after.ipsets.keys():
            _count(
                self.set_refs.setdefault(set_name, Counter()),
                before.ipsets.get(set_name, set()),
                after.ipsets.get(set_name, set()),
                delta.ipset_add.setdefault(set_name, set()),
                delta.ipset_delete.setdefault(set_name, set()),
            )
        self.no_local.update(after.no_local)
        self.no_local.subtract(before.no_local)

    def desired(self) -> Desired:
        """The whole family, as a full sync writes it."""
        d = Desired(ipsets={n: set(c) for n, c in self.set_refs.items()})
        for key in sorted(self.owners):
            d.services[key] = self.parts[max(self.owners[key])].desired.services[key]
        d.addresses = set(self.address_refs)
        d.no_local = dict(self.no_local)
        d.iptables = iptables_text(self.node, self.cfg)
        return d


def _count(refs: Counter[T], before: Iterable[T], after: Iterable[T], came: set[T],
           went: set[T]) -> None:  # fmt: skip
    """Move one user's items from ``before`` to ``after``; note items that appeared or whose
    last user left (an item that leaves and comes back within one sync is neither)."""
    b, a = set(before), set(after)
    for item in b - a:
        refs[item] -= 1
        if refs[item] <= 0:
            del refs[item]
            if item in came:
                came.discard(item)
            else:
                went.add(item)
    for item in a - b:
        if refs[item] == 0:
            if item in went:
                went.discard(item)
            else:
                came.add(item)
        refs[item] += 1


def render(state: ProxyState, cfg: IpvsConfig) -> Desired:
    """Everything one family wants: every service's part, and the fixed iptables rules."""
    return Table.build(state, cfg).desired()
