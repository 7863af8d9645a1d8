"""One family's kube-proxy table as pyproxy programmed it, and the transactions that move the
kernel to the next one. Pure: nothing here touches the kernel.

Each service's objects are rendered once and kept with everything they were rendered from, so
a sync renders again only the services whose inputs changed. Shared set and map elements are
counted per contributing service and mirrored as written, so a partial transaction adds,
replaces or deletes only the elements that differ and never reads the kernel back (upstream's
``nftElementStorage``). Chains of unchanged services are never written; a chain no longer used
is flushed at once and deleted by a later transaction at least a second on, because kernels
before 6.2 keep a removed map element's chain referenced for a moment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pyproxy.backends.nftables.render import (
    MAPS,
    SETS,
    TABLE,
    Element,
    NftConfig,
    NodeFacts,
    ServiceObjects,
    render_port,
)
from pyproxy.backends.nftables.static import BASE_CHAINS, TABLE_COMMENT, Static, static_objects
from pyproxy.model.types import NamespacedName, ProxyState

ElementKey = tuple[str, str]  # (container, key)
ElementValue = tuple[str, str]  # (value, comment)


@dataclass(frozen=True)
class ServiceEntry:
    key: tuple[object, ...]
    objects: ServiceObjects


Updates = Mapping[NamespacedName, ServiceEntry | None]


def node_facts(state: ProxyState, cfg: NftConfig) -> NodeFacts:
    return NodeFacts(
        state.node, cfg.proxy.local_cidrs(state.node, cfg.family), state.node.primary_ip(cfg.family)
    )


@dataclass
class Rendered:
    """A family's complete table: the static part and every service's objects."""

    cfg: NftConfig
    node: NodeFacts
    service_cidrs: tuple[object, ...]
    static: Static
    entries: dict[NamespacedName, ServiceEntry] = field(default_factory=dict)
    contributions: dict[ElementKey, Counter[ElementValue]] = field(default_factory=dict)
    no_local: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for e in self.static.elements:
            self._contribute(e, 1)
        for entry in self.entries.values():
            self._count(entry, 1)

    def _contribute(self, e: Element, sign: int) -> None:
        votes = self.contributions.setdefault((e.container, e.key), Counter())
        votes[(e.value, e.comment)] += sign
        if votes[(e.value, e.comment)] <= 0:
            del votes[(e.value, e.comment)]
        if not votes:
            del self.contributions[(e.container, e.key)]

    def _count(self, entry: ServiceEntry, sign: int) -> None:
        for e in entry.objects.elements:
            self._contribute(e, sign)
        self.no_local["internal"] += sign * entry.objects.no_local_internal
        self.no_local["external"] += sign * entry.objects.no_local_external

    def apply(self, updates: Updates) -> None:
        """Record that ``updates`` were programmed (None: the service is gone)."""
        for svc, entry in updates.items():
            old = self.entries.pop(svc, None)
            if old is not None:
                self._count(old, -1)
            if entry is not None:
                self.entries[svc] = entry
                self._count(entry, 1)

    def element(self, key: ElementKey) -> Element | None:
        """The element the table should hold for ``key`` (one value wins if services
        disagree, as in upstream where the last writer wins)."""
        votes = self.contributions.get(key)
        if not votes:
            return None
        value, comment = min(votes)
        return Element(key[0], key[1], value, comment)

    def elements(self) -> list[Element]:
        out = [self.element(k) for k in sorted(self.contributions)]
        return [e for e in out if e is not None]

    def service_chains(self) -> dict[str, list[str]]:
        return {
            c: r
            for svc in sorted(self.entries)
            for c, r in self.entries[svc].objects.chains.items()
        }

    def affinity_sets(self) -> dict[str, str]:
        return {s: d for e in self.entries.values() for s, d in e.objects.sets.items()}

    def service_counters(self) -> dict[str, str]:
        """Named counter -> the service port it counts (--service-metrics)."""
        entries = list(self.entries.values())  # one step: a sync may change them meanwhile
        return {c: p for e in entries for c, p in e.objects.counters.items()}

    def rule_count(self) -> int:
        return sum(len(r) for r in self.static.rules.values()) + sum(
            len(r) for e in self.entries.values() for r in e.objects.chains.values()
        )

    # ---- as text ------------------------------------------------------------------------

    def prefix(self, verb: str, kind: str) -> str:
        return f"{verb} {kind} {self.cfg.nft_family} {TABLE}"

    def dump(self) -> str:
        """The table as upstream's knftables Fake dumps it: every object added, once."""
        rules = [
            f"{self.prefix('add', 'rule')} {c} {r}\n"
            for c, rs in self.service_chains().items()
            for r in rs
        ]
        decls = [f"{self.prefix('add', 'chain')} {c}\n" for c in self.service_chains()]
        head = [self.table_line(), *self.container_lines(), *self.static_chain_lines(False)]
        return "".join([*head, *decls, *self.static_rule_lines(), *self.element_lines(), *rules])

    def table_line(self) -> str:
        return f'{self.prefix("add", "table")} {{ comment "{TABLE_COMMENT}" ; }}\n'

    def container_lines(self) -> list[str]:
        """The shared sets and maps, then the services' affinity sets."""
        s = self.static
        out = [f"{self.prefix('add', 'set')} {n} {d}\n" for n, d in s.sets.items()]
        out += [f"{self.prefix('add', 'map')} {n} {d}\n" for n, d in s.maps.items()]
        out += [f"{self.prefix('add', 'counter')} {n}\n" for n in s.counters]
        return out + [
            f"{self.prefix('add', 'set')} {n} {d}\n" for n, d in self.affinity_sets().items()
        ]

    def static_chain_lines(self, flush: bool) -> list[str]:
        out = []
        for name, definition in self.static.chains.items():
            out.append(f"{self.prefix('add', 'chain')} {name} {definition}".rstrip() + "\n")
            if flush:
                out.append(f"{self.prefix('flush', 'chain')} {name}\n")
        return out

    def static_rule_lines(self) -> list[str]:
        rules = self.static.rules.items()
        return [f"{self.prefix('add', 'rule')} {c} {r}\n" for c, rs in rules for r in rs]

    def element_lines(self) -> list[str]:
        return [
            f"{self.prefix('add', 'element')} {e.container} {e.text()}\n" for e in self.elements()
        ]


class Renderer:
    """Renders one family's services, reusing each one's objects while its inputs are the same."""

    def __init__(self, cfg: NftConfig) -> None:
        self.cfg = cfg
        self.renders = 0

    def entry(
        self, state: ProxyState, svc: NamespacedName, node: NodeFacts, cached: ServiceEntry | None
    ) -> ServiceEntry | None:
        ports = tuple(state.ports_of(svc, self.cfg.family))
        if not ports:
            return None
        eps = tuple(state.endpoints_for(p.name, self.cfg.family) for p in ports)
        key = (ports, eps, node)
        if cached is not None and cached.key == key:
            return cached
        self.renders += 1
        objects = ServiceObjects()
        for sp, endpoints in zip(ports, eps, strict=True):
            objects.merge(render_port(sp, endpoints, node, self.cfg))
        return ServiceEntry(key, objects)

    def full(self, state: ProxyState, previous: Rendered | None = None) -> Rendered:
        node = node_facts(state, self.cfg)
        old = previous.entries if previous is not None else {}
        entries = {}
        for svc in state.service_names():
            entry = self.entry(state, svc, node, old.get(svc))
            if entry is not None:
                entries[svc] = entry
        static = static_objects(self.cfg, node, state.service_cidrs)
        return Rendered(self.cfg, node, state.service_cidrs, static, entries)

    def updates(
        self, state: ProxyState, changed: Iterable[NamespacedName], programmed: Rendered
    ) -> dict[NamespacedName, ServiceEntry | None] | None:
        """The changed services' new objects, or None when the static part changed too (the
        node's facts or the service CIDRs): then only a full sync will do."""
        node = node_facts(state, self.cfg)
        if node != programmed.node or state.service_cidrs != programmed.service_cidrs:
            return None
        out: dict[NamespacedName, ServiceEntry | None] = {}
        for svc in changed:
            old = programmed.entries.get(svc)
            new = self.entry(state, svc, node, old)
            if new is not old:
                out[svc] = new
        return out


def render(state: ProxyState, cfg: NftConfig) -> Rendered:
    return Renderer(cfg).full(state)


__all__ = ["BASE_CHAINS", "MAPS", "SETS", "Rendered", "Renderer", "ServiceEntry", "render"]
