"""``pyproxy trace`` in nftables mode: follow the first packet of a connection through the
rendered objects of table kube-proxy: its base chains hook by hook in priority order, the
verdict maps (service-ips, service-nodeports, firewall-ips, no-endpoint-*) by their elements,
numgen's random choice as equal branches. Pure: it reads the render, never the kernel.

Only the expressions pyproxy renders are known; anything else is a TraceError, so a rule the
walk cannot read is never silently taken for one that does not match.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pyproxy.backends.nftables import names
from pyproxy.backends.nftables.rule import (
    AnonSet,
    Counter,
    Ct,
    Dnat,
    Expr,
    Fib,
    MarkTest,
    Masquerade,
    Match,
    NumgenVmap,
    Rule,
    SetMark,
    SetRef,
    Update,
    Verdict,
    Vmap,
)
from pyproxy.backends.nftables.static import BASE_CHAINS
from pyproxy.backends.nftables.table import Rendered
from pyproxy.backends.trace import (
    AFFINITY_NOTE,
    DNAT,
    DROP,
    REJECT,
    Flow,
    Outcome,
    Packet,
    TraceError,
    outcome,
)
from pyproxy.model.types import IPAddress


@dataclass
class Table:
    hooks: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    """hook -> (priority, base chain), in the order netfilter runs them."""
    rules: Mapping[str, Sequence[Rule]] = field(default_factory=dict)
    elements: dict[str, dict[tuple[str, ...], Verdict | None]] = field(default_factory=dict)
    """set or map -> key parts -> verdict (None in a set)."""


def table_of(r: Rendered) -> Table:
    """The walk's view of a rendered table: nothing is parsed."""
    hooks: dict[str, list[tuple[int, str]]] = {}
    for name, _, hook, prio in BASE_CHAINS:
        hooks.setdefault(hook, []).append((int(prio), name))
    for chains in hooks.values():
        chains.sort()
    rules: dict[str, Sequence[Rule]] = {c: r.static.rules.get(c, []) for c in r.static.chains}
    rules.update(r.service_chains())
    elements: dict[str, dict[tuple[str, ...], Verdict | None]] = {
        n: {} for n in (*r.static.sets, *r.static.maps, *r.affinity_sets())
    }
    for e in r.elements():
        elements.setdefault(e.container, {})[e.key] = e.value
    return Table(hooks, rules, elements)


def _in(addr: IPAddress, value: str) -> bool:
    return addr in ipaddress.ip_network(value, strict=False)


NO_MATCH = -1
"""``Walker._condition``: the packet fails the condition, so the rule does not match."""


class Walker:
    def __init__(self, table: Table, local: Iterable[IPAddress]) -> None:
        self.table = table
        self.local = frozenset(local)

    def is_local(self, addr: IPAddress) -> bool:
        return addr in self.local or addr.is_loopback

    # ---- one rule -------------------------------------------------------------------------

    def _key(self, part: str, packet: Packet, f: Flow) -> str:
        if part in ("ip daddr", "ip6 daddr"):
            return str(f.dst)
        if part in ("ip saddr", "ip6 saddr"):
            return str(packet.src)
        if part == "meta l4proto":
            return packet.protocol.value.lower()
        if part == "th dport":
            return str(f.port)
        raise TraceError(f"trace cannot follow the key {part!r}")

    def _keys(self, keys: tuple[str, ...], packet: Packet, f: Flow) -> tuple[str, ...]:
        return tuple(self._key(k, packet, f) for k in keys)

    def _lookup(self, name: str, key: tuple[str, ...]) -> tuple[bool, Verdict | None]:
        """(whether ``key`` is in set or map ``name``, the map's verdict for it)."""
        elements = self.table.elements.get(name)
        if elements is None:
            raise TraceError(f"no set or map {name} in the render")
        for k, v in elements.items():
            if len(k) == len(key) and all(_elem_match(e, x) for e, x in zip(k, key, strict=True)):
                return True, v
        return False, None

    def rule(self, chain: str, rule: Rule, packet: Packet,
             flow: Flow) -> list[tuple[Flow, str]]:  # fmt: skip
        """Run one rule: the branches, each with the verdict it reached ("" to go on to the
        next rule, "jump X"/"goto X", "return", or a terminal: accept, drop, reject, dnat,
        masquerade). Conditions are read left to right until one fails; then statements."""
        step = f"chain {chain}: {rule.text}"
        for e in rule.exprs:
            if not self._holds(e, step, packet, flow):
                return [(flow, "")]
            ended = self._statement(e, step, packet, flow)
            if ended is not None:
                return ended
        return [(flow, "")]

    def _holds(self, e: Expr, step: str, packet: Packet, f: Flow) -> bool:
        """Whether the packet passes ``e`` (a statement always does)."""
        if isinstance(e, Ct):
            if (e.what, e.value) == ("state", "new"):
                return True
            if (e.what, e.value) == ("status", "dnat"):
                return f.dnat
            raise TraceError(f"trace cannot follow {e.text} in: {step}")
        if isinstance(e, Fib):
            return self.is_local(f.dst if e.which == "daddr" else packet.src)
        if isinstance(e, MarkTest):
            return f.mark & int(e.mask, 0) != 0
        if not isinstance(e, Match):
            return True
        key = self._keys(e.keys, packet, f)
        if isinstance(e.value, SetRef):
            if names.is_affinity_set(e.value.name):
                f.notes.append(AFFINITY_NOTE)
            found = self._lookup(e.value.name, key)[0]
        elif isinstance(e.value, AnonSet):
            found = any(_in(ipaddress.ip_address(key[0]), v) for v in e.value.values)
        elif e.keys == ("meta l4proto",):
            found = key[0] == e.value
        else:
            found = _in(ipaddress.ip_address(key[0]), e.value)
        return found != e.negated

    def _statement(self, e: Expr, step: str, packet: Packet,
                   f: Flow) -> list[tuple[Flow, str]] | None:  # fmt: skip
        """The branches when ``e`` ends the rule, else None (after any change it makes)."""
        if isinstance(e, (Match, Ct, Fib, MarkTest, Counter, Update)):
            return None
        if isinstance(e, SetMark):
            _matched(f, step)
            value = int(e.value, 0)
            f.mark = f.mark | value if e.op == "or" else f.mark ^ value
            return None
        if isinstance(e, Vmap):
            key = self._keys(e.keys, packet, f)
            verdict = self._lookup(e.map, key)[1]
            if verdict is None:
                return [(f, "")]
            f.steps.append(f"{step}  [element {' . '.join(key)} : {verdict.text}]")
            return [(f, verdict.text)]
        if isinstance(e, Verdict):
            return [(_matched(f, step), e.text)]
        if isinstance(e, Masquerade):
            _matched(f, step).masquerade = True
            return [(f, "masquerade")]
        if isinstance(e, NumgenVmap):
            n, branches = len(e.verdicts), []
            for i, v in enumerate(e.verdicts):
                g = _matched(f, step).fork(f.probability / n)
                g.steps[-1] += f"  [{i} : {v.text}]"
                branches.append((g, v.text))
            return branches
        if isinstance(e, Dnat):
            return self._dnat(e, _matched(f, step))
        raise TraceError(f"trace cannot follow {e.text!r} in: {step}")

    def _dnat(self, e: Dnat, f: Flow) -> list[tuple[Flow, str]]:
        out = []
        for ep in e.targets:
            g = f.fork(f.probability / len(e.targets))
            g.dst, g.port = ep.ip, ep.port
            g.dnat, g.verdict = True, DNAT
            if len(e.targets) > 1:
                g.steps[-1] += f"  [-> {ep.hostport}]"
            out.append((g, "dnat"))
        return out

    # ---- chains and hooks -----------------------------------------------------------------

    def chain(self, name: str, packet: Packet, flow: Flow,
              depth: int = 0) -> list[tuple[Flow, str]]:  # fmt: skip
        """Run chain ``name``: each branch with "return" (it ended or returned) or the terminal
        verdict it reached."""
        if depth > 32:
            raise TraceError(f"chain loop at {name}")
        if name not in self.table.rules:
            raise TraceError(f"no chain {name} in the render")
        active, done = [flow], []
        for rule in self.table.rules[name]:
            nxt: list[Flow] = []
            for f in active:
                for g, verdict in self.rule(name, rule, packet, f):
                    if verdict == "":
                        nxt.append(g)
                    elif verdict == "return":
                        done.append((g, "return"))
                    elif verdict.startswith(("jump ", "goto ")):
                        kind, target = verdict.split()
                        seen = len(g.steps)
                        for h, v in self.chain(target, packet, g, depth + 1):
                            if v != "return":
                                done.append((h, v))
                            elif kind == "goto":
                                done.append((h, "return"))
                            else:
                                if len(h.steps) == seen:  # nothing in it matched: not a step
                                    h.steps.pop()
                                nxt.append(h)
                    else:
                        done.append((g, verdict))
            active = nxt
        return done + [(f, "return") for f in active]

    def hook(self, hook: str, packet: Packet, flows: list[Flow]) -> list[Flow]:
        for _, base in self.table.hooks.get(hook, []):
            nxt: list[Flow] = []
            for f in flows:
                if f.verdict in (DROP, REJECT):
                    nxt.append(f)
                    continue
                for g, verdict in self.chain(base, packet, f):
                    if verdict in ("drop", "reject"):
                        g.verdict = DROP if verdict == "drop" else REJECT
                    nxt.append(g)
            flows = nxt
        return flows

    def walk(self, packet: Packet) -> list[Outcome]:
        flows = [Flow(packet.dst, packet.port)]
        if self.is_local(packet.src):
            flows = self.hook("output", packet, flows)
        else:
            flows = self.hook("prerouting", packet, flows)
            routed: list[Flow] = []
            for f in flows:
                routed += self.hook("input" if self.is_local(f.dst) else "forward", packet, [f])
            flows = routed
        flows = self.hook("postrouting", packet, flows)
        return [outcome(f) for f in flows]


def _matched(f: Flow, step: str) -> Flow:
    """Record the rule as matched, once."""
    if not f.steps or f.steps[-1] != step:
        f.steps.append(step)
    return f


def _elem_match(element: str, value: str) -> bool:
    if "/" in element:
        try:
            return ipaddress.ip_address(value) in ipaddress.ip_network(element, strict=False)
        except ValueError:
            return False
    return element == value
