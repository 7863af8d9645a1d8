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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pyproxy.backends.engine.cache import Entry, ServiceCache, ServiceTable
from pyproxy.backends.iptables import names
from pyproxy.backends.iptables.endpoint_chain import lines as chain_lines
from pyproxy.backends.iptables.render import (
    FILTER_TOP,
    KUBE_FIREWALL,
    KUBE_SERVICES,
    LARGE_CLUSTER_ENDPOINTS,
    NAT_TOP,
    Chains,
    IptablesConfig,
    NodeFacts,
    ServiceRender,
    node_facts,
    nodeports_tail,
    render_service,
    static_lines,
)
from pyproxy.backends.xtables.rule import Rule
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


class Restore(NamedTuple):
    """iptables-restore input and how many rules it writes per table (the metric
    ``kubeproxy_sync_proxy_rules_iptables_last``), counted from the rules, not the text."""

    text: str
    written: Counter[str]


Updates = Mapping[NamespacedName, ServiceEntry | None]

OwnChains = list[tuple[str, Sequence[Rule]]]
"""Services' own chains with their rules, in the order a transaction writes them."""


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
        static_filter: Chains,
        static_nat: Chains,
        tail: list[Rule],
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

    def counted_chains(self) -> dict[str, str]:
        """Endpoint chain -> the service port its DNAT rule counts."""
        entries = list(self.entries.values())  # one step: a sync may change them meanwhile
        return {
            c: port for e in entries for port, chains in e.objects.counted.items() for c in chains
        }

    def service_chains(self) -> set[str]:
        return {c for e in self.entries.values() for c in e.objects.chains}

    def _ordered(self) -> list[ServiceRender]:
        return [self.entries[svc].objects for svc in sorted(self.entries)]

    def top(self, table: str) -> Chains:
        """Every top-level chain of ``table`` with its rules, in write order."""
        chains = self.filter_chain_names() if table == "filter" else NAT_TOP
        static = self.static_filter if table == "filter" else self.static_nat
        out = {c: list(static.get(c, [])) for c in chains}
        for r in self._ordered():
            for chain, lines in (r.top_filter if table == "filter" else r.top_nat).items():
                out[chain] += lines
        if table == "nat":
            out[KUBE_SERVICES] += self.tail
        return out

    def tables(self) -> dict[str, dict[str, Sequence[Rule]]]:
        """table -> chain -> rules, every chain pyproxy writes (what ``trace`` walks)."""
        nat: dict[str, Sequence[Rule]] = dict(self.top("nat"))
        for r in self._ordered():
            nat.update(r.chains)
        return {"filter": dict(self.top("filter")), "nat": nat}

    def text(self, delete_chains: Iterable[str] = ()) -> str:
        """iptables-restore input of a full sync in one transaction."""
        return "".join(self.batches(delete_chains, max_lines=None))

    def batches(self, delete_chains: Iterable[str] = (), max_lines: int | None = None) -> list[str]:
        """A full sync as ordered transactions of at most about ``max_lines`` rules (None:
        one). Services' own chains come first, endpoint chains before the chains that jump to
        them; the last transaction writes the top-level chains that make them reachable and
        deletes stale chains. No rule ever jumps to a chain not yet written, so the kernel is
        consistent between any two of them."""
        services = self._ordered()
        own = [(c, rules) for r in services for c, rules in r.chains.items()]
        if max_lines is None:
            return [self._last_batch(own, delete_chains)]
        rank = {kind: i for i, kind in enumerate(CHAIN_ORDER)}
        ranked = [(rank[r.kind(c)], c, rules) for r in services for c, rules in r.chains.items()]
        ranked.sort(key=lambda item: item[0])  # stable: services stay in name order
        own = [(c, rules) for _, c, rules in ranked]
        out: list[str] = []
        chunk: OwnChains = []
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

    def _last_batch(self, own: OwnChains, delete_chains: Iterable[str]) -> str:
        filt = self.top("filter")
        nat = self.top("nat")
        stale = sorted(set(delete_chains) - self.service_chains())
        lines = ["*filter", *(f":{c} - [0:0]" for c in filt)]
        lines += [r.text for chain in filt.values() for r in chain] + ["COMMIT", "*nat"]
        lines += [f":{c} - [0:0]" for c in (*nat, *(c for c, _ in own), *stale)]
        lines += [r.text for chain in nat.values() for r in chain]
        lines += [line for _, rules in own for line in chain_lines(rules)]
        lines += [f"-X {c}" for c in stale] + ["COMMIT", ""]
        return "\n".join(lines)  # ends in a newline without a second copy of the text


def _nat_text(chains: OwnChains) -> str:
    lines = ["*nat", *(f":{c} - [0:0]" for c, _ in chains)]
    lines += [line for _, rules in chains for line in chain_lines(rules)] + ["COMMIT", ""]
    return "\n".join(lines)


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


def partial_restore(programmed: Rendered, updates: Updates) -> Restore:
    """iptables-restore input moving the kernel from ``programmed`` to it plus ``updates``:
    the changed services' own chains, rewritten or deleted, and their rules in the top-level
    chains deleted and inserted. Its text is empty when there is nothing to write.

    Chains are emptied with ``-F`` and created with ``-N`` rather than declared
    (``:CHAIN - [0:0]``): iptables-nft-restore answers a declaration by reading every chain
    of the table from the kernel, so a partial sync built on declarations costs what the
    cluster has (170 ms at 50,000 chains on this machine), one built on ``-F``/``-N`` what
    changed (28 ms; ``tests/bench/kernel_load.py``). It relies on ``programmed`` being what
    the kernel holds; when it is not, the restore fails and the next sync is a full one."""
    written: Counter[str] = Counter()
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
        for cmds, table, before, after in (
            (filter_cmds, "filter", old_r.top_filter, new_r.top_filter),
            (nat_cmds, "nat", old_r.top_nat, new_r.top_nat),
        ):
            deleted, inserted = _top_delta(before, after)
            cmds += [f"-D {r.chain} {r.spec}" for r in deleted]
            cmds += [f"-I {r.chain} 1 {r.spec}" for r in inserted]
            written[table] += len(inserted)
        for chain, rules in new_r.chains.items():
            decls.append(f"-F {chain}" if chain in old_r.chains else f"-N {chain}")
            own_rules += chain_lines(rules)
            written["nat"] += len(rules)
        for chain in old_r.chains:
            if chain not in new_r.chains:
                decls.append(f"-F {chain}")
                deletes.append(f"-X {chain}")
    if not (filter_cmds or nat_cmds or decls):
        return Restore("", written)
    out = ["*filter", *filter_cmds, "COMMIT", "*nat", *decls, *nat_cmds, *own_rules, *deletes]
    return Restore("\n".join([*out, "COMMIT"]) + "\n", written)


def _top_delta(
    old: Mapping[str, list[Rule]], new: Mapping[str, list[Rule]]
) -> tuple[list[Rule], list[Rule]]:
    """One service's top-level rules that went away (to ``-D``) and those that are new (to
    ``-I ... 1``, in reverse, so they keep their order at the head of the chain)."""
    deleted: list[Rule] = []
    inserted: list[Rule] = []
    for chain in dict.fromkeys((*old, *new)):
        before, after = old.get(chain, []), new.get(chain, [])
        if before == after:
            continue
        deleted += _take(before, Counter(before) - Counter(after))
        inserted += reversed(_take(after, Counter(after) - Counter(before)))
    return deleted, inserted


def _take(rules: list[Rule], wanted: Counter[Rule]) -> list[Rule]:
    """The first ``wanted[rule]`` occurrences of each rule, in order."""
    left = Counter(wanted)
    out = []
    for rule in rules:
        if left[rule] > 0:
            left[rule] -= 1
            out.append(rule)
    return out
