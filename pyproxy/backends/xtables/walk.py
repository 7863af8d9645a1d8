"""``pyproxy trace`` for the modes that write iptables rules: follow the first packet of a
connection through the rendered rules, from the built-in chains' jumps into pyproxy's
chains, hook by hook as netfilter runs them (nat PREROUTING or OUTPUT, then filter INPUT,
FORWARD or OUTPUT, then nat POSTROUTING). Pure: it reads the render, never the kernel.

Only the matches and targets pyproxy renders are known; any other option is a TraceError, so
a rule the walk cannot read is never silently taken for one that does not match.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence

from pyproxy.backends.trace import (
    AFFINITY_NOTE,
    DNAT,
    DROP,
    REJECT,
    RELAY,
    Flow,
    Outcome,
    Packet,
    TraceError,
    outcome,
)
from pyproxy.backends.xtables.rule import Rule
from pyproxy.backends.xtables.rules import JumpRule
from pyproxy.model.types import IPAddress

LocalIn = Callable[[Packet, Flow], list[Flow]]
SetLookup = Callable[[str, str, Packet, Flow], bool]
"""``-m set --match-set NAME FLAGS``: is the packet (as ``flow`` has changed it) in the set?"""

Tables = Mapping[str, Mapping[str, Sequence[Rule]]]
"""table -> chain -> its rules, in order: what a mode renders."""

_IGNORED = frozenset({"--comment", "--name", "--seconds", "--reap", "--mode", "--set"})
"""Options that say nothing about whether a first packet matches (affinity's bookkeeping,
the statistic mode whose probability is read on its own)."""


def _in(addr: IPAddress, value: str) -> bool:
    return addr in ipaddress.ip_network(value, strict=False)


class Walker:
    """The walk over one family's rendered tables (plus the jumps into them)."""

    def __init__(
        self,
        tables: Tables,
        jumps: Iterable[JumpRule],
        local: Iterable[IPAddress],
        mark: str,
        sets: SetLookup | None = None,
    ) -> None:
        self.tables = tables
        self.local = frozenset(local)
        self.mark = int(mark, 0)
        self.sets = sets
        self.jumps: dict[tuple[str, str], list[Rule]] = {}
        # Each jump is inserted at the head of its built-in chain: the last one runs first.
        for j in reversed(tuple(jumps)):
            self.jumps.setdefault((j.table, j.chain), []).append(j.rule())

    def rules(self, table: str, chain: str) -> Sequence[Rule]:
        own = self.tables.get(table, {}).get(chain, ())
        jumps = self.jumps.get((table, chain))
        return [*own, *jumps] if jumps else own

    def is_chain(self, table: str, chain: str) -> bool:
        return chain in self.tables.get(table, {})

    def is_local(self, addr: IPAddress) -> bool:
        return addr in self.local or addr.is_loopback

    # ---- matching -------------------------------------------------------------------------

    def _match(self, rule: Rule, packet: Packet, flow: Flow) -> float | None:
        """The probability the rule matches (None: it does not; statistic rules: theirs)."""
        p = 1.0
        proto = packet.protocol.value.lower()
        src = packet.src
        for m in rule.matches:
            opt, value = m.option, m.value
            if opt in _IGNORED:
                continue
            if opt == "--probability":
                p *= float(value)
                continue
            if opt == "--rcheck":
                flow.notes.append(AFFINITY_NOTE)
                return None
            if opt == "-s":
                ok = _in(src, value)
            elif opt == "-d":
                ok = _in(flow.dst, value)
            elif opt == "-p":
                ok = value == proto
            elif opt == "--dport":
                ok = int(value) == flow.port
            elif opt == "--dst-type":
                ok = value == "LOCAL" and self.is_local(flow.dst)
            elif opt == "--src-type":
                ok = value == "LOCAL" and self.is_local(src)
            elif opt == "--ctstate":
                states = set(value.split(","))
                ok = "NEW" in states or ("DNAT" in states and flow.dnat)
            elif opt == "--mark":
                val, _, mask = value.partition("/")
                ok = flow.mark & int(mask or "0xffffffff", 0) == int(val, 0)
            elif opt == "--match-set":
                if self.sets is None:
                    raise TraceError(f"no ipsets to look up for: {rule.text}")
                name, flags = value.split(" ")
                ok = self.sets(name, flags, packet, flow)
            else:
                raise TraceError(f"trace cannot follow {opt} in: {rule.text}")
            if ok == m.negated:
                return None
        return p

    # ---- walking --------------------------------------------------------------------------

    def chain(self, table: str, chain: str, packet: Packet, flow: Flow,
              depth: int = 0) -> list[tuple[Flow, bool]]:  # fmt: skip
        """Run ``chain`` on ``flow``: the branches, each with True when it stopped (a terminal
        target) and False when it returned to the caller."""
        if depth > 32:
            raise TraceError(f"chain loop at {table} {chain}")
        active, done = [flow], []
        for rule in self.rules(table, chain):
            nxt: list[Flow] = []
            for f in active:
                p = self._match(rule, packet, f)
                if p is None:
                    nxt.append(f)
                    continue
                if p < 1.0:
                    nxt.append(f.fork(f.probability * (1 - p)))
                    f = f.fork(f.probability * p)
                f.steps.append(f"-t {table} {rule.text}")
                seen = len(f.steps)
                for g, stopped in self._target(table, rule, packet, f, depth):
                    if not stopped and len(g.steps) == seen and self.is_chain(table, rule.target):
                        g.steps.pop()  # a jump into a chain where nothing matched: not a step
                    if stopped:
                        done.append((g, True))
                    elif rule.goto or rule.target == "RETURN":
                        done.append((g, False))
                    else:
                        nxt.append(g)
            active = nxt
        return done + [(f, False) for f in active]

    def _target(self, table: str, rule: Rule, packet: Packet, f: Flow,
                depth: int) -> list[tuple[Flow, bool]]:  # fmt: skip
        t, arg = rule.target, rule.target_option
        if self.is_chain(table, t):
            return self.chain(table, t, packet, f, depth + 1)
        if t == "" or t == "RETURN":
            return [(f, False)]
        if t == "MARK":
            if (value := arg("--or-mark")) is not None:
                f.mark |= int(value, 0)
            elif (value := arg("--xor-mark")) is not None:
                f.mark ^= int(value, 0)
            return [(f, False)]
        if t == "DNAT":
            host, _, port = (arg("--to-destination") or "").rpartition(":")
            f.dst, f.port = ipaddress.ip_address(host.strip("[]")), int(port)
            f.dnat, f.verdict = True, DNAT
        elif t == "REDIRECT":
            f.redirect, f.verdict = arg("--to-ports") or "", RELAY
        elif t == "MASQUERADE":
            f.masquerade = True
        elif t in ("DROP", "REJECT"):
            f.verdict = DROP if t == "DROP" else REJECT
        elif t != "ACCEPT":
            raise TraceError(f"trace cannot follow target {t} in: {rule.text}")
        return [(f, True)]

    def hook(self, table: str, chain: str, packet: Packet, flows: list[Flow]) -> list[Flow]:
        out: list[Flow] = []
        for f in flows:
            if f.verdict in (DROP, REJECT):
                out.append(f)
                continue
            out += [g for g, _ in self.chain(table, chain, packet, f)]
        return out

    def walk(self, packet: Packet, local_in: LocalIn | None = None) -> list[Outcome]:
        """Every branch the first packet can take, hook by hook; ``local_in`` (IPVS mode) takes
        what the filter rules let through to a local address (or out of the node)."""
        flows = [Flow(packet.dst, packet.port)]
        from_node = self.is_local(packet.src)
        flows = self.hook("nat", "OUTPUT" if from_node else "PREROUTING", packet, flows)
        routed: list[Flow] = []
        for f in flows:
            if from_node:
                routed += self.hook("filter", "OUTPUT", packet, [f])
            else:
                hook = "INPUT" if self.is_local(f.dst) or f.verdict == RELAY else "FORWARD"
                routed += self.hook("filter", hook, packet, [f])
        if local_in is not None:
            stopped = (DROP, REJECT)
            routed = [g for f in routed
                      for g in ([f] if f.verdict in stopped else local_in(packet, f))]  # fmt: skip
        flows = self.hook("nat", "POSTROUTING", packet, routed)
        return [outcome(f) for f in flows]
