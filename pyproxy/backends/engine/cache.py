"""One family's rendered services, each kept with the inputs it was rendered from, so that a
sync renders again only the services whose inputs changed (kpng's diff store is the
precedent: keyed leaves, compared by their inputs).

A mode renders one service (all its ports) from its ports, their endpoints and the *facts*
every service's render depends on (the node's addresses and labels, upstream's "large
cluster" switch, ...). Facts that change mean every service may render differently: only a
full sync will do. Pure: nothing here touches the kernel.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pyproxy.model.types import Endpoint, IPFamily, NamespacedName, ProxyState, ServicePort


class Objects(Protocol):
    """What every mode's per-service objects say about traffic policy (for the
    ``kubeproxy_sync_proxy_rules_no_local_endpoints_total`` gauge)."""

    no_local_internal: int
    no_local_external: int


Obj = TypeVar("Obj", bound=Objects)
F = TypeVar("F", bound=Hashable)


@dataclass(frozen=True)
class Entry(Generic[Obj]):
    """One service's objects and what they were rendered from."""

    key: tuple[object, ...]
    objects: Obj
    endpoints: int


Updates = Mapping[NamespacedName, "Entry[Obj] | None"]
"""The changed services' new entries (None: the service is gone from this family)."""


class ServiceTable(Generic[Obj]):
    """A family's services as rendered: what the kernel holds once a sync was accepted.
    A mode's table adds its static objects and what it derives from the entries (rule
    counts, shared set elements) by extending ``_count``."""

    def __init__(
        self,
        facts: Hashable,
        entries: Mapping[NamespacedName, Entry[Obj]],
        static_inputs: Hashable = (),
    ) -> None:
        self.facts = facts
        self.static_inputs = static_inputs
        """What the mode's static objects alone were built from (nftables: the service
        CIDRs): a change needs a full sync but renders no service again."""
        self.entries: dict[NamespacedName, Entry[Obj]] = {}
        self.endpoints = 0
        self.no_local: Counter[str] = Counter(internal=0, external=0)
        for svc, entry in entries.items():
            self.entries[svc] = entry
            self._count(svc, entry, 1)

    def _count(self, svc: NamespacedName, entry: Entry[Obj], sign: int) -> None:
        self.endpoints += sign * entry.endpoints
        self.no_local["internal"] += sign * entry.objects.no_local_internal
        self.no_local["external"] += sign * entry.objects.no_local_external

    def apply(self, updates: Updates[Obj]) -> None:
        """Record that the kernel accepted ``updates``: only the engine calls this, and only
        after the write succeeded."""
        for svc, entry in updates.items():
            old = self.entries.pop(svc, None)
            if old is not None:
                self._count(svc, old, -1)
            if entry is not None:
                self.entries[svc] = entry
                self._count(svc, entry, 1)


T = TypeVar("T", bound=ServiceTable[Any])


class ServiceCache(abc.ABC, Generic[Obj, F, T]):
    """Renders one family's services, reusing each one's objects while its inputs are the
    same. A mode's cache says how a table is made of the entries (``table``) and what its
    static objects depend on beyond the facts (``static_inputs``)."""

    def __init__(
        self,
        family: IPFamily,
        facts: Callable[[ProxyState, int], F],
        render: Callable[[tuple[ServicePort, ...], tuple[tuple[Endpoint, ...], ...], F], Obj],
    ) -> None:
        """``facts``: what every service's render depends on, for a state whose family has
        this many endpoints in all; ``render``: one service's objects."""
        self.family = family
        self.facts = facts
        self._render = render
        self.renders = 0
        """Services rendered so far (a cache miss each); tests count them."""

    @abc.abstractmethod
    def table(self, state: ProxyState, facts: F, entries: Mapping[NamespacedName, Entry[Obj]]) -> T:
        """The whole table for ``state``: the mode's static objects and ``entries``."""

    def static_inputs(self, state: ProxyState) -> Hashable:
        """What the static objects are built from beyond the facts (a change: full sync)."""
        return ()

    def render(self, state: ProxyState, previous: T | None = None) -> T:
        """The whole table; unchanged services reuse ``previous``'s rendering."""
        return self.table(state, *self.full(state, previous))

    def entry(
        self, state: ProxyState, svc: NamespacedName, facts: F, cached: Entry[Obj] | None
    ) -> Entry[Obj] | None:
        """``svc``'s objects (None when it has no port in this family), from ``cached`` when
        nothing they depend on changed."""
        ports = tuple(state.ports_of(svc, self.family))
        if not ports:
            return None
        eps = tuple(state.endpoints_for(p.name, self.family) for p in ports)
        key = (ports, eps, facts)
        if cached is not None and cached.key == key:
            return cached
        self.renders += 1
        return Entry(key, self._render(ports, eps, facts), sum(len(e) for e in eps))

    def full(
        self, state: ProxyState, previous: ServiceTable[Obj] | None = None
    ) -> tuple[F, dict[NamespacedName, Entry[Obj]]]:
        """The facts and every service's entry; unchanged services reuse ``previous``'s."""
        total = sum(
            len(state.endpoints_for(p.name, self.family))
            for p in state.sorted_services(self.family)
        )
        facts = self.facts(state, total)
        old = previous.entries if previous is not None else {}
        entries = {}
        for svc in state.service_names():
            entry = self.entry(state, svc, facts, old.get(svc))
            if entry is not None:
                entries[svc] = entry
        return facts, entries

    def updates(
        self, state: ProxyState, changed: Iterable[NamespacedName], table: ServiceTable[Obj]
    ) -> dict[NamespacedName, Entry[Obj] | None] | None:
        """The changed services' new entries, or None when the facts changed (before or
        because of these changes: upstream's large-cluster switch counts endpoints), so
        that every service may render differently and only a full sync will do."""
        facts = self.facts(state, table.endpoints)
        if facts != table.facts:
            return None
        out: dict[NamespacedName, Entry[Obj] | None] = {}
        total = table.endpoints
        for svc in changed:
            old = table.entries.get(svc)
            new = self.entry(state, svc, facts, old)
            if new is not old:
                out[svc] = new
                total += (new.endpoints if new else 0) - (old.endpoints if old else 0)
        if self.facts(state, total) != table.facts:
            return None
        return out
