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
from collections.abc import Mapping

from pyproxy.backends.engine.cache import Entry, ServiceCache, ServiceTable
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
from pyproxy.backends.nftables.rule import Rule, Verdict
from pyproxy.backends.nftables.static import BASE_CHAINS, TABLE_COMMENT, Static, static_objects
from pyproxy.model.types import Endpoint, NamespacedName, ProxyState, ServicePort

ElementKey = tuple[str, tuple[str, ...]]  # (container, key)
ElementValue = tuple[Verdict | None, str]  # (value, comment)


ServiceEntry = Entry[ServiceObjects]


def element_order(key: ElementKey) -> tuple[str, str]:
    """Elements are written in the order of their text (as knftables' Fake dumps them)."""
    return key[0], " . ".join(key[1])


Updates = Mapping[NamespacedName, ServiceEntry | None]


def node_facts(state: ProxyState, cfg: NftConfig) -> NodeFacts:
    return NodeFacts(
        state.node, cfg.proxy.local_cidrs(state.node, cfg.family), state.node.primary_ip(cfg.family)
    )


class Rendered(ServiceTable[ServiceObjects]):
    """A family's complete table: the static part and every service's objects."""

    def __init__(
        self,
        cfg: NftConfig,
        node: NodeFacts,
        service_cidrs: tuple[object, ...],
        static: Static,
        entries: Mapping[NamespacedName, ServiceEntry],
    ) -> None:
        self.cfg = cfg
        self.static = static
        self.contributions: dict[ElementKey, Counter[ElementValue]] = {}
        for e in static.elements:
            self._contribute(e, 1)
        super().__init__(node, entries, service_cidrs)
        self.node = node
        self.service_cidrs = service_cidrs

    def _contribute(self, e: Element, sign: int) -> None:
        votes = self.contributions.setdefault((e.container, e.key), Counter())
        votes[(e.value, e.comment)] += sign
        if votes[(e.value, e.comment)] <= 0:
            del votes[(e.value, e.comment)]
        if not votes:
            del self.contributions[(e.container, e.key)]

    def _count(self, svc: NamespacedName, entry: ServiceEntry, sign: int) -> None:
        super()._count(svc, entry, sign)
        for e in entry.objects.elements:
            self._contribute(e, sign)

    def elements_after(self, updates: Updates) -> dict[ElementKey, Element | None]:
        """The element each key the ``updates`` touch would hold once they are applied,
        computed without applying them (the kernel has not accepted them yet)."""
        delta: dict[ElementKey, Counter[ElementValue]] = {}
        for svc, entry in updates.items():
            old = self.entries.get(svc)
            for sign, objects in ((-1, old.objects if old else None),
                                  (1, entry.objects if entry else None)):  # fmt: skip
                for e in objects.elements if objects else ():
                    delta.setdefault((e.container, e.key), Counter())[(e.value, e.comment)] += sign
        out: dict[ElementKey, Element | None] = {}
        for key, change in delta.items():
            votes = Counter(self.contributions.get(key, {}))
            votes.update(change)
            alive = [v for v, n in votes.items() if n > 0]
            out[key] = Element(key[0], key[1], *min(alive)) if alive else None
        return out

    def element(self, key: ElementKey) -> Element | None:
        """The element the table should hold for ``key`` (one value wins if services
        disagree, as in upstream where the last writer wins)."""
        votes = self.contributions.get(key)
        if not votes:
            return None
        value, comment = min(votes)
        return Element(key[0], key[1], value, comment)

    def elements(self) -> list[Element]:
        out = [self.element(k) for k in sorted(self.contributions, key=element_order)]
        return [e for e in out if e is not None]

    def service_chains(self) -> dict[str, list[Rule]]:
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
            f"{self.prefix('add', 'rule')} {c} {r.text}\n"
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
        return [f"{self.prefix('add', 'rule')} {c} {r.text}\n" for c, rs in rules for r in rs]

    def element_lines(self) -> list[str]:
        return [
            f"{self.prefix('add', 'element')} {e.container} {e.text()}\n" for e in self.elements()
        ]


class Renderer(ServiceCache[ServiceObjects, NodeFacts, Rendered]):
    """Renders one family's services, reusing each one's objects while its inputs are the same."""

    def __init__(self, cfg: NftConfig) -> None:
        def render(
            ports: tuple[ServicePort, ...], eps: tuple[tuple[Endpoint, ...], ...], node: NodeFacts
        ) -> ServiceObjects:
            objects = ServiceObjects()
            for sp, endpoints in zip(ports, eps, strict=True):
                objects.merge(render_port(sp, endpoints, node, cfg))
            return objects

        super().__init__(cfg.family, lambda state, _: node_facts(state, cfg), render)
        self.cfg = cfg

    def table(
        self, state: ProxyState, facts: NodeFacts, entries: Mapping[NamespacedName, ServiceEntry]
    ) -> Rendered:
        static = static_objects(self.cfg, facts, state.service_cidrs)
        return Rendered(self.cfg, facts, state.service_cidrs, static, entries)

    def static_inputs(self, state: ProxyState) -> tuple[object, ...]:
        """The service CIDRs: the static part's only input beyond the node's facts."""
        return state.service_cidrs


def render(state: ProxyState, cfg: NftConfig) -> Rendered:
    return Renderer(cfg).render(state)


__all__ = ["BASE_CHAINS", "MAPS", "SETS", "Rendered", "Renderer", "ServiceEntry", "render"]
