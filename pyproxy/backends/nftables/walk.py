"""``pyproxy trace`` in nftables mode: follow the first packet of a connection through the
rendered ``nft -f`` text of table kube-proxy: its base chains hook by hook in priority order,
the verdict maps (service-ips, service-nodeports, firewall-ips, no-endpoint-*) by their
elements, numgen's random choice as equal branches. Pure: it reads the render, never the
kernel.

Only the expressions pyproxy renders are known; anything else is a TraceError, so a rule the
walk cannot read is never silently taken for one that does not match.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

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
    """hook -> (priority, base chain)."""
    rules: dict[str, list[str]] = field(default_factory=dict)
    elements: dict[str, dict[tuple[str, ...], str]] = field(default_factory=dict)
    """set or map -> key parts -> verdict ("" for a set)."""


def _body(line: str, words: int) -> str:
    """``line`` without its first ``words`` words (``add rule ip kube-proxy CHAIN``: 5)."""
    return line.split(None, words)[words] if len(line.split(None, words)) > words else ""


def parse(text: str) -> Table:
    t = Table()
    for line in text.splitlines():
        words = line.split()
        if len(words) < 5 or words[0] not in ("add", "flush", "delete"):
            continue
        verb, kind, name = words[0], words[1], words[4]
        if kind == "chain":
            if verb == "add" and " hook " in line:
                tokens = line.split()
                hook = tokens[tokens.index("hook") + 1]
                prio = int(tokens[tokens.index("priority") + 1])
                t.hooks.setdefault(hook, []).append((prio, name))
            if verb in ("flush", "delete") or name not in t.rules:
                t.rules[name] = []
        elif kind == "rule":
            t.rules.setdefault(name, []).append(_body(line, 5))
        elif kind in ("set", "map"):
            if verb in ("flush", "delete") or name not in t.elements:
                t.elements[name] = {}
        elif kind == "element":
            inner = _body(line, 5).strip().removeprefix("{").removesuffix("}").strip()
            key, _, value = inner.partition(" : ")
            key = key.split(" comment ", 1)[0]
            t.elements.setdefault(name, {})[tuple(k.strip() for k in key.split(" . "))] = (
                value.strip()
            )
    for chains in t.hooks.values():
        chains.sort()
    return t


def _in(addr: IPAddress, value: str) -> bool:
    return addr in ipaddress.ip_network(value.rstrip(","), strict=False)


NO_MATCH = -1
"""``Walker._condition``: the packet fails the condition, so the rule does not match."""
PROTOCOLS = ("tcp", "udp", "sctp")


class Walker:
    def __init__(self, text: str, local: Iterable[IPAddress]) -> None:
        self.table = parse(text)
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

    def _lookup(self, name: str, key: tuple[str, ...]) -> str | None:
        elements = self.table.elements.get(name)
        if elements is None:
            raise TraceError(f"no set or map {name} in the render")
        for k, v in elements.items():
            if len(k) == len(key) and all(_elem_match(e, x) for e, x in zip(k, key, strict=True)):
                return v
        return None

    def rule(self, chain: str, rule: str, packet: Packet,
             flow: Flow) -> list[tuple[Flow, str]]:  # fmt: skip
        """Run one rule: the branches, each with the verdict it reached ("" to go on to the
        next rule, "jump X"/"goto X", "return", or a terminal: accept, drop, reject, dnat,
        masquerade). Conditions are read left to right until one fails; then statements."""
        words = shlex.split(rule)
        rule = f"chain {chain}: {rule}"
        i = 0
        while i < len(words):
            nxt = self._condition(words, i, rule, packet, flow)
            if nxt == NO_MATCH:
                return [(flow, "")]
            if nxt is None:
                ended, nxt = self._statement(words, i, rule, packet, flow)
                if ended is not None:
                    return ended
            i = nxt
        return [(flow, "")]

    def _key_at(self, words: list[str], i: int, packet: Packet,
                f: Flow) -> tuple[tuple[str, ...], int]:  # fmt: skip
        """The packet's value of the key at ``words[i]``, maybe concatenated (a . b . c), and
        the index after it."""
        parts = [f"{words[i]} {words[i + 1]}"]
        j = i + 2
        while j + 2 < len(words) and words[j] == ".":
            parts.append(f"{words[j + 1]} {words[j + 2]}")
            j += 3
        return tuple(self._key(p, packet, f) for p in parts), j

    def _condition(self, words: list[str], i: int, rule: str, packet: Packet,
                   f: Flow) -> int | None:  # fmt: skip
        """A condition (or a no-op) at ``words[i]``: the index after it, NO_MATCH when the
        packet fails it, None when ``words[i]`` starts a statement."""
        w, rest = words[i], words[i:]
        if w == "comment":
            return i + 2
        if w == "counter":
            return i + (3 if len(words) > i + 1 and words[i + 1] == "name" else 1)
        if rest[:3] == ["ct", "state", "new"]:
            return i + 3
        if rest[:3] == ["ct", "status", "dnat"]:
            return i + 3 if f.dnat else NO_MATCH
        if rest[:2] in (["fib", "daddr"], ["fib", "saddr"]):
            if rest[2:4] != ["type", "local"]:
                raise TraceError(f"trace cannot follow {' '.join(rest[:4])} in: {rule}")
            addr = f.dst if words[i + 1] == "daddr" else packet.src
            return i + 4 if self.is_local(addr) else NO_MATCH
        if rest[:2] == ["mark", "and"]:
            mask, cmp, val = int(words[i + 2], 0), words[i + 3], int(words[i + 4], 0)
            return i + 5 if (f.mark & mask != val) == (cmp == "!=") else NO_MATCH
        if w not in ("ip", "ip6", "meta", "th") or i + 1 >= len(words):
            return None
        if rest[:2] == ["meta", "l4proto"] and len(rest) > 2 and rest[2] in PROTOCOLS:
            return i + 3 if rest[2] == packet.protocol.value.lower() else NO_MATCH
        key, j = self._key_at(words, i, packet, f)
        if words[j] == "vmap":  # a verdict map: a statement
            return None
        negated = words[j] == "!="
        j += negated
        value = words[j]
        if value.startswith("@"):
            if value.startswith("@affinity-"):
                f.notes.append(AFFINITY_NOTE)
            found, j = self._lookup(value[1:], key) is not None, j + 1
        elif value == "{":
            end = words.index("}", j)
            found = any(_in(ipaddress.ip_address(key[0]), v)
                        for v in words[j + 1 : end] if v != ",")  # fmt: skip
            j = end + 1
        else:
            found, j = _in(ipaddress.ip_address(key[0]), value), j + 1
        return j if found != negated else NO_MATCH

    def _statement(self, words: list[str], i: int, rule: str, packet: Packet,
                   f: Flow) -> tuple[list[tuple[Flow, str]] | None, int]:  # fmt: skip
        """The statement at ``words[i]``: (the branches, when it ends the rule, else None;
        the index after it)."""
        w, rest = words[i], words[i:]
        if rest[:4] in (["mark", "set", "mark", "or"], ["mark", "set", "mark", "xor"]):
            _matched(f, rule)
            value = int(words[i + 4], 0)
            f.mark = f.mark | value if rest[3] == "or" else f.mark ^ value
            return None, i + 5
        if w == "update":
            return None, words.index("}", i) + 1
        if w in ("ip", "ip6", "meta", "th"):  # key vmap @map
            key, j = self._key_at(words, i, packet, f)
            verdict = self._lookup(words[j + 1].lstrip("@"), key)
            if verdict is None:
                return [(f, "")], j + 2
            f.steps.append(f"{rule}  [element {' . '.join(key)} : {verdict}]")
            return [(f, verdict)], j + 2
        if w in ("jump", "goto"):
            return [(_matched(f, rule), f"{w} {words[i + 1]}")], i + 2
        if w in ("accept", "drop", "reject", "return"):
            return [(_matched(f, rule), w)], i + 1
        if w == "masquerade":
            _matched(f, rule).masquerade = True
            return [(f, "masquerade")], i + 1
        if w == "numgen":
            if words[i + 4] != "vmap":
                raise TraceError(f"trace cannot follow numgen {words[i + 4]} in: {rule}")
            n, end = int(words[i + 3]), words.index("}", i)
            branches = []
            for pair in " ".join(words[i + 6 : end]).split(" , "):
                g = _matched(f, rule).fork(f.probability / n)
                g.steps[-1] += f"  [{pair}]"
                branches.append((g, pair.partition(" : ")[2]))
            return branches, end + 1
        if w == "dnat":
            return self._dnat(words[i:], rule, _matched(f, rule)), len(words)
        raise TraceError(f"trace cannot follow {w!r} in: {rule}")

    def _dnat(self, words: list[str], rule: str, f: Flow) -> list[tuple[Flow, str]]:
        if words[1] == "to":
            targets = [words[2]]
        elif words[2:6] == ["addr", ".", "port", "to"] and words[6] == "numgen":
            end = words.index("}")
            pairs = " ".join(words[12:end]).split(" , ")
            targets = [":".join(p.partition(" : ")[2].split(" . ")) for p in pairs]
        else:
            raise TraceError(f"trace cannot follow this dnat: {rule}")
        out = []
        for t in targets:
            g = f.fork(f.probability / len(targets))
            host, _, port = t.rpartition(":")
            g.dst, g.port = ipaddress.ip_address(host.strip("[]")), int(port)
            g.dnat, g.verdict = True, DNAT
            if len(targets) > 1:
                g.steps[-1] += f"  [-> {t}]"
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


def _matched(f: Flow, rule: str) -> Flow:
    """Record ``rule`` as matched, once."""
    if not f.steps or f.steps[-1] != rule:
        f.steps.append(rule)
    return f


def _elem_match(element: str, value: str) -> bool:
    if "/" in element:
        try:
            return ipaddress.ip_address(value) in ipaddress.ip_network(element, strict=False)
        except ValueError:
            return False
    return element == value
