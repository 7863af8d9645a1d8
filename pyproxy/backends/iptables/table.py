"""One family's iptables rule set as pyproxy programmed it, and the restore input that moves the
kernel to the next one: all of it (a full sync, in ordered batches when large) or only what
changed (a partial sync). Pure: nothing here touches the kernel.

Each service's rules are rendered once and kept with everything they were rendered from (its
ports, endpoints, the node's facts, whether the table is "large"): a later sync renders again
only a service whose inputs differ. The top-level chains (KUBE-SERVICES, KUBE-NODEPORTS, ...)
are never rebuilt on a partial sync: a changed service's lines there are deleted (``-D``) and
inserted at the head (``-I``), so the cost of a partial sync follows the change, and the
NodePort tail rule of KUBE-SERVICES stays last.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyproxy.backends.engine.cache import Entry, ServiceCache, ServiceTable
from pyproxy.backends.iptables import names
from pyproxy.backends.iptables.render import (
    FILTER_TOP,
    KUBE_FIREWALL,
    KUBE_SERVICES,
    LARGE_CLUSTER_ENDPOINTS,
    NAT_TOP,
    IptablesConfig,
    NodeFacts,
    ServiceRender,
    node_facts,
    nodeports_tail,
    render_service,
    static_lines,
)
from pyproxy.backends.xtables.rules import KUBE_MARK_MASQ
from pyproxy.model.types import Endpoint, NamespacedName, ProxyState, ServicePort

# Chains of one service in the order a cold start writes them: each jumps only to kinds
# written before it (SVC/SVL -> SEP, EXT -> SVC/SVL, FW -> EXT).
CHAIN_ORDER = (names.SEP, names.SVC, names.SVL, names.EXT, names.FW)


@dataclass(frozen=True)
class Facts:
    """What every service's rules depend on besides its own ports and endpoints."""

    node: NodeFacts
    large: bool
    """Upstream's large-cluster switch (more than 1,000 endpoints in the family): no
    comments and no per-endpoint counters in the rules."""


ServiceEntry = Entry[ServiceRender]
Updates = Mapping[NamespacedName, ServiceEntry | None]


def _rule_counts(r: ServiceRender) -> Counter[str]:
    return Counter(
        filter=sum(len(v) for v in r.top_filter.values()),
        nat=sum(len(v) for v in r.top_nat.values()) + sum(len(v) for v in r.chains.values()),
    )


class Rendered(ServiceTable[ServiceRender]):
    """A family's complete rule set: lines that depend on no service, and every service's."""

    def __init__(
        self,
        cfg: IptablesConfig,
        facts: Facts,
        static_filter: dict[str, list[str]],
        static_nat: dict[str, list[str]],
        tail: list[str],
        entries: Mapping[NamespacedName, ServiceEntry],
    ) -> None:
        self.cfg = cfg
        self.static_filter = static_filter
        self.static_nat = static_nat
        self.tail = tail
        self.counts: Counter[str] = Counter(
            filter=sum(len(v) for v in static_filter.values()),
            nat=sum(len(v) for v in static_nat.values()) + len(tail),
        )
        super().__init__(facts, entries)
        self.facts: Facts = facts

    @property
    def node(self) -> NodeFacts:
        return self.facts.node

    @property
    def large(self) -> bool:
        return self.facts.large

    @property
    def services(self) -> dict[NamespacedName, ServiceRender]:
        return {svc: e.objects for svc, e in self.entries.items()}

    def _count(self, svc: NamespacedName, entry: ServiceEntry, sign: int) -> None:
        super()._count(svc, entry, sign)
        for table, n in _rule_counts(entry.objects).items():
            self.counts[table] += sign * n

    def filter_chain_names(self) -> tuple[str, ...]:
        return FILTER_TOP + ((KUBE_FIREWALL,) if self.cfg.localhost_enabled else ())

    def service_chains(self) -> set[str]:
        return {c for e in self.entries.values() for c in e.objects.chains}

    def _ordered(self) -> list[ServiceRender]:
        return [self.entries[svc].objects for svc in sorted(self.entries)]

    def top(self, table: str) -> dict[str, list[str]]:
        """Every top-level chain of ``table`` with its lines, in write order."""
        chains = self.filter_chain_names() if table == "filter" else NAT_TOP
        static = self.static_filter if table == "filter" else self.static_nat
        out = {c: list(static.get(c, [])) for c in chains}
        for r in self._ordered():
            for chain, lines in (r.top_filter if table == "filter" else r.top_nat).items():
                out[chain] += lines
        if table == "nat":
            out[KUBE_SERVICES] += self.tail
        return out

    def text(self, delete_chains: Iterable[str] = ()) -> str:
        """iptables-restore input of a full sync in one transaction."""
        return "".join(self.batches(delete_chains, max_lines=None))

    def batches(self, delete_chains: Iterable[str] = (), max_lines: int | None = None) -> list[str]:
        """A full sync as ordered transactions of at most about ``max_lines`` rules (None:
        one). Services' own chains come first, endpoint chains before the chains that jump to
        them; the last transaction writes the top-level chains that make them reachable and
        deletes stale chains. No rule ever jumps to a chain not yet written, so the kernel is
        consistent between any two of them."""
        own = [(c, lines) for r in self._ordered() for c, lines in r.chains.items()]
        if max_lines is None:
            return [self._last_batch(own, delete_chains)]
        own.sort(key=lambda item: CHAIN_ORDER.index(item[0][: item[0].index("-", 5) + 1]))
        out: list[str] = []
        chunk: list[tuple[str, list[str]]] = []
        size = 0
        # Endpoint and service chains jump to KUBE-MARK-MASQ: the first transaction writes it.
        mark_masq = [(KUBE_MARK_MASQ, self.static_nat.get(KUBE_MARK_MASQ, []))]
        for chain, lines in own:
            chunk.append((chain, lines))
            size += len(lines) + 1
            if size >= max_lines:
                out.append(_nat_text(mark_masq + chunk if not out else chunk))
                chunk, size = [], 0
        out.append(self._last_batch(chunk, delete_chains))
        return out

    def _last_batch(self, own: list[tuple[str, list[str]]], delete_chains: Iterable[str]) -> str:
        filt = self.top("filter")
        nat = self.top("nat")
        stale = sorted(set(delete_chains) - self.service_chains())
        lines = ["*filter", *(f":{c} - [0:0]" for c in filt)]
        lines += [line for chain in filt.values() for line in chain] + ["COMMIT", "*nat"]
        lines += [f":{c} - [0:0]" for c in (*nat, *(c for c, _ in own), *stale)]
        lines += [line for chain in nat.values() for line in chain]
        lines += [line for _, rules in own for line in rules]
        lines += [f"-X {c}" for c in stale] + ["COMMIT"]
        return "\n".join(lines) + "\n"


def _nat_text(chains: list[tuple[str, list[str]]]) -> str:
    lines = ["*nat", *(f":{c} - [0:0]" for c, _ in chains)]
    lines += [line for _, rules in chains for line in rules] + ["COMMIT"]
    return "\n".join(lines) + "\n"


class Renderer(ServiceCache[ServiceRender, Facts, Rendered]):
    """Renders one family's services, reusing each one's rules while its inputs are the same."""

    def __init__(self, cfg: IptablesConfig) -> None:
        def facts(state: ProxyState, endpoints: int) -> Facts:
            return Facts(node_facts(state, cfg), endpoints > LARGE_CLUSTER_ENDPOINTS)

        def render(
            ports: tuple[ServicePort, ...], eps: tuple[tuple[Endpoint, ...], ...], f: Facts
        ) -> ServiceRender:
            return render_service(ports, eps, f.node, cfg, f.large)

        super().__init__(cfg.family, facts, render)
        self.cfg = cfg

    def table(
        self, state: ProxyState, facts: Facts, entries: Mapping[NamespacedName, ServiceEntry]
    ) -> Rendered:
        """The rule set of ``entries`` with the lines that depend on no service."""
        filt, nat = static_lines(facts.node, self.cfg)
        return Rendered(self.cfg, facts, filt, nat, nodeports_tail(facts.node, self.cfg), entries)


def render(state: ProxyState, cfg: IptablesConfig) -> Rendered:
    """The complete rule set for ``cfg.family``."""
    return Renderer(cfg).render(state)


def partial_text(programmed: Rendered, updates: Updates) -> str:
    """iptables-restore input moving the kernel from ``programmed`` to it plus ``updates``:
    the changed services' own chains, rewritten or deleted, and their lines in the top-level
    chains deleted and inserted. Empty when there is nothing to write.

    Chains are emptied with ``-F`` and created with ``-N`` rather than declared
    (``:CHAIN - [0:0]``): iptables-nft-restore answers a declaration by reading every chain
    of the table from the kernel, so a partial sync built on declarations costs what the
    cluster has (170 ms at 50,000 chains on this machine), one built on ``-F``/``-N`` what
    changed (28 ms; ``tests/bench/kernel_load.py``). It relies on ``programmed`` being what
    the kernel holds; when it is not, the restore fails and the next sync is a full one."""
    filter_cmds: list[str] = []
    nat_cmds: list[str] = []
    decls: list[str] = []
    own_rules: list[str] = []
    deletes: list[str] = []
    for svc in sorted(updates):
        old = programmed.entries.get(svc)
        new = updates[svc]
        old_r = old.objects if old else ServiceRender()
        new_r = new.objects if new else ServiceRender()
        filter_cmds += _top_delta(old_r.top_filter, new_r.top_filter)
        nat_cmds += _top_delta(old_r.top_nat, new_r.top_nat)
        for chain, lines in new_r.chains.items():
            decls.append(f"-F {chain}" if chain in old_r.chains else f"-N {chain}")
            own_rules += lines
        for chain in old_r.chains:
            if chain not in new_r.chains:
                decls.append(f"-F {chain}")
                deletes.append(f"-X {chain}")
    if not (filter_cmds or nat_cmds or decls):
        return ""
    out = ["*filter", *filter_cmds, "COMMIT", "*nat", *decls, *nat_cmds, *own_rules, *deletes]
    return "\n".join([*out, "COMMIT"]) + "\n"


def _top_delta(old: Mapping[str, list[str]], new: Mapping[str, list[str]]) -> list[str]:
    """``-D`` of one service's top-level lines that went away, ``-I ... 1`` of those that
    are new (in reverse, so they keep their order at the head of the chain)."""
    cmds: list[str] = []
    for chain in dict.fromkeys((*old, *new)):
        before, after = old.get(chain, []), new.get(chain, [])
        if before == after:
            continue
        gone = Counter(before) - Counter(after)
        added = Counter(after) - Counter(before)
        cmds += [f"-D {line[3:]}" for line in _take(before, gone)]
        cmds += [
            f"-I {chain} 1 {line[3 + len(chain) + 1 :]}" for line in reversed(_take(after, added))
        ]
    return cmds


def _take(lines: list[str], wanted: Counter[str]) -> list[str]:
    """The first ``wanted[line]`` occurrences of each line, in order."""
    left = Counter(wanted)
    out = []
    for line in lines:
        if left[line] > 0:
            left[line] -= 1
            out.append(line)
    return out
