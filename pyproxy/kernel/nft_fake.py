"""A checking stand-in for the nft port (``Nft``), for unit tests: it keeps tables, chains,
rules, sets, maps, elements and counters in memory and refuses, as the kernel would, what
pyproxy must never write: a rule or a map element that jumps to a missing chain or to a base
chain, a reference to a missing set, a deleted chain, set or counter that something still
references, an element whose key or value does not fit the set's type, a prefix in a set
without ``flags interval``, a base chain whose hook changes, an object in a missing table,
and deleting or flushing what is not there. A refused transaction changes nothing, as a
kernel transaction. knftables' fake (``fake.go``) is the precedent; this one reads the nft
text pyproxy writes, since that text is what the kernel gets.

It also counts listings (``listings``) and keeps every accepted transaction (``runs``), so
tests can say what a sync wrote and what it read back.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from dataclasses import dataclass, field

from pyproxy.kernel.nft import Nft, NftError

# Names are compared without the quotes nft allows around them.
_VERDICT_TARGET = re.compile(r'\b(?:jump|goto) "?([^\s,{}"]+)"?')
_SET_REF = re.compile(r'@"?([^\s,{}"]+)"?')
_COUNTER_REF = re.compile(r'\bcounter name "?([^\s,{}"]+)"?')
_PLAIN_VERDICTS = ("accept", "drop", "return", "continue")
_PROTOCOLS = {"tcp", "udp", "sctp", "icmp", "icmpv6"}


@dataclass
class Chain:
    base: str = ""
    """``type ... hook ... priority ...`` of a base chain ("" for a regular chain)."""
    rules: list[str] = field(default_factory=list)


@dataclass
class Set:
    kind: str
    """"set" or "map"."""
    key: tuple[str, ...]
    value: tuple[str, ...]
    flags: frozenset[str]
    elements: dict[str, str] = field(default_factory=dict)
    """Key text -> value text ("" in a set)."""


@dataclass
class Table:
    chains: dict[str, Chain] = field(default_factory=dict)
    sets: dict[str, Set] = field(default_factory=dict)
    counters: set[str] = field(default_factory=set)


class Refused(Exception):
    """One command the kernel would refuse."""


def _fields(spec: str) -> dict[str, str]:
    """``{ type a . b : verdict ; flags x,y ; comment "..." ; }`` -> its fields."""
    body = spec.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise Refused(f"syntax error: {spec!r}")
    out = {}
    for part in re.split(r" ; | ;$|;", body[1:-1]):
        part = part.strip()
        if part:
            word, _, rest = part.partition(" ")
            out[word] = rest.strip()
    return out


def _check_value(typ: str, text: str, flags: frozenset[str]) -> None:
    """Refuse ``text`` where the kernel would refuse it as a value of ``typ``."""
    if typ in ("ipv4_addr", "ipv6_addr"):
        version = 4 if typ == "ipv4_addr" else 6
        try:
            if "/" in text:
                if "interval" not in flags:
                    raise Refused(f"{text}: a prefix needs 'flags interval' in the set")
                net = ipaddress.ip_network(text)
                ok = net.version == version
            else:
                ok = ipaddress.ip_address(text).version == version
        except ValueError:
            ok = False
        if not ok:
            raise Refused(f"datatype mismatch: {text!r} is not {typ}")
    elif typ == "inet_proto":
        if text not in _PROTOCOLS and not (text.isdigit() and int(text) < 256):
            raise Refused(f"datatype mismatch: {text!r} is not a protocol")
    elif typ == "inet_service":
        if not (text.isdigit() and int(text) < 65536):
            raise Refused(f"datatype mismatch: {text!r} is not a port")
    elif typ == "verdict":
        word = text.split(" ", 1)[0]
        if word not in (*_PLAIN_VERDICTS, "jump", "goto"):
            raise Refused(f"datatype mismatch: {text!r} is not a verdict")
    else:
        raise Refused(f"unknown type {typ}")


class FakeNft(Nft):
    """An nftables kernel in memory that refuses what the kernel refuses (see the module)."""

    def __init__(self) -> None:
        self.how = "checking fake"
        self.tables_: dict[tuple[str, str], Table] = {}
        self.runs: list[str] = []
        self.listings = 0

    # ---- the port -----------------------------------------------------------------------

    def usable(self) -> str | None:
        return None

    def run(self, text: str, flags: int = 0, fresh: bool = False) -> str:
        """One transaction: all of it, or (NftError) none of it."""
        before = copy.deepcopy(self.tables_)
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                self._command(line)
            except Refused as err:
                self.tables_ = before
                raise NftError(f"Error: {err} (line {n}: {line})") from None
        self.runs.append(text)
        return ""

    def names(self, family: str, table: str) -> dict[str, set[str]]:
        self.listings += 1
        t = self.tables_.get((family, table))
        if t is None:  # nft lists a family's objects: a missing table has none
            return {"chain": set(), "set": set(), "map": set()}
        return {
            "chain": set(t.chains),
            "set": {n for n, s in t.sets.items() if s.kind == "set"},
            "map": {n for n, s in t.sets.items() if s.kind == "map"},
        }

    def counters(self, family: str, table: str) -> dict[str, tuple[int, int]]:
        self.listings += 1
        t = self.tables_.get((family, table))
        return dict.fromkeys(sorted(t.counters), (0, 0)) if t else {}

    def tables(self) -> set[tuple[str, str]]:
        self.listings += 1
        return set(self.tables_)

    def table(self, family: str, table: str) -> Table:
        """What the fake kernel holds (tests compare it)."""
        return self.tables_[(family, table)]

    # ---- commands -----------------------------------------------------------------------

    def _command(self, line: str) -> None:
        words = line.split(" ", 4)
        if len(words) < 4:
            raise Refused("syntax error")
        verb, kind, family, name = words[:4]
        rest = words[4] if len(words) > 4 else ""
        key = (family, name)
        if kind == "table":
            if verb == "add":
                self.tables_.setdefault(key, Table())
            elif verb == "delete":
                if self.tables_.pop(key, None) is None:
                    raise Refused(f"No such file or directory: table {family} {name}")
            elif verb == "flush":
                for chain in self._table(key).chains.values():
                    chain.rules.clear()
            else:
                raise Refused(f"unsupported: {verb} table")
            return
        t = self._table(key)
        obj, _, spec = rest.partition(" ")
        obj = obj.strip('"')
        if not obj:
            raise Refused("syntax error: no object name")
        handler = getattr(self, f"_{verb}_{kind}", None)
        if handler is None:
            raise Refused(f"unsupported: {verb} {kind}")
        handler(t, obj, spec)

    def _table(self, key: tuple[str, str]) -> Table:
        t = self.tables_.get(key)
        if t is None:
            raise Refused(f"No such file or directory: table {key[0]} {key[1]}")
        return t

    @staticmethod
    def _chain(t: Table, name: str) -> Chain:
        chain = t.chains.get(name)
        if chain is None:
            raise Refused(f"No such file or directory: chain {name}")
        return chain

    @staticmethod
    def _set(t: Table, name: str, kind: str) -> Set:
        s = t.sets.get(name)
        if s is None or (kind != "element" and s.kind != kind):
            raise Refused(f"No such file or directory: {kind} {name}")
        return s

    @staticmethod
    def _jump_target(t: Table, target: str) -> None:
        chain = t.chains.get(target)
        if chain is None:
            raise Refused(f"No such file or directory: jump to missing chain {target}")
        if chain.base:
            raise Refused(f"Operation not supported: jump to base chain {target}")

    @staticmethod
    def _referrers(t: Table, pattern: re.Pattern[str], name: str, skip: str = "") -> list[str]:
        out = [f"rule in {c}" for c, chain in t.chains.items() if c != skip
               for r in chain.rules if name in pattern.findall(r)]  # fmt: skip
        if pattern is _VERDICT_TARGET:
            out += [f"element of {s}" for s, st in t.sets.items()
                    for v in st.elements.values() if name in pattern.findall(v)]  # fmt: skip
        return out

    def _add_chain(self, t: Table, name: str, spec: str) -> None:
        fields = _fields(spec) if spec else {}
        base = " ".join(f"{k} {v}" for k, v in fields.items() if k != "comment")
        chain = t.chains.get(name)
        if chain is None:
            t.chains[name] = Chain(base)
        elif base and chain.base != base:
            raise Refused(f"Device or resource busy: chain {name} exists with another hook")

    def _flush_chain(self, t: Table, name: str, spec: str) -> None:
        self._chain(t, name).rules.clear()

    def _delete_chain(self, t: Table, name: str, spec: str) -> None:
        self._chain(t, name)
        users = self._referrers(t, _VERDICT_TARGET, name, skip=name)
        if users:
            raise Refused(f"Device or resource busy: chain {name} is used by {users[0]}")
        del t.chains[name]

    def _add_rule(self, t: Table, name: str, spec: str) -> None:
        chain = self._chain(t, name)
        for target in _VERDICT_TARGET.findall(spec):
            self._jump_target(t, target)
        for ref in _SET_REF.findall(spec):
            if ref not in t.sets:
                raise Refused(f"No such file or directory: set {ref}")
        for ref in _COUNTER_REF.findall(spec):
            if ref not in t.counters:
                raise Refused(f"No such file or directory: counter {ref}")
        chain.rules.append(spec)

    def _add_set(self, t: Table, name: str, spec: str, kind: str = "set") -> None:
        fields = _fields(spec)
        key, _, value = fields.get("type", "").partition(" : ")
        if not key:
            raise Refused(f"set {name} has no type")
        if (kind == "map") != bool(value):
            raise Refused(f"a {kind} {'needs' if kind == 'map' else 'has no'} value type")
        flags = frozenset(f for f in fields.get("flags", "").split(",") if f)
        new = Set(kind, tuple(key.split(" . ")), tuple(value.split(" . ")) if value else (), flags)
        have = t.sets.get(name)
        if have is None:
            t.sets[name] = new
        elif (have.kind, have.key, have.value) != (new.kind, new.key, new.value):
            raise Refused(f"File exists: {kind} {name} with another type")

    def _add_map(self, t: Table, name: str, spec: str) -> None:
        self._add_set(t, name, spec, "map")

    def _flush_set(self, t: Table, name: str, spec: str) -> None:
        self._set(t, name, "set").elements.clear()

    def _flush_map(self, t: Table, name: str, spec: str) -> None:
        self._set(t, name, "map").elements.clear()

    def _delete_set(self, t: Table, name: str, spec: str, kind: str = "set") -> None:
        self._set(t, name, kind)
        users = self._referrers(t, _SET_REF, name)
        if users:
            raise Refused(f"Device or resource busy: {kind} {name} is used by {users[0]}")
        del t.sets[name]

    def _delete_map(self, t: Table, name: str, spec: str) -> None:
        self._delete_set(t, name, spec, "map")

    def _add_counter(self, t: Table, name: str, spec: str) -> None:
        t.counters.add(name)

    def _delete_counter(self, t: Table, name: str, spec: str) -> None:
        if name not in t.counters:
            raise Refused(f"No such file or directory: counter {name}")
        users = self._referrers(t, _COUNTER_REF, name)
        if users:
            raise Refused(f"Device or resource busy: counter {name} is used by {users[0]}")
        t.counters.discard(name)

    def _elements(self, s: Set, spec: str) -> list[tuple[str, str]]:
        body = spec.strip()
        if not (body.startswith("{") and body.endswith("}")):
            raise Refused(f"syntax error: {spec!r}")
        out = []
        for item in body[1:-1].split(" , "):
            key, _, value = item.strip().partition(" : ")
            key = re.sub(r' comment "[^"]*"', "", key).strip()
            parts = key.split(" . ")
            if len(parts) != len(s.key):
                raise Refused(f"datatype mismatch: {key!r} for a key of {' . '.join(s.key)}")
            for typ, part in zip(s.key, parts, strict=True):
                _check_value(typ, part, s.flags)
            if s.value:
                vparts = value.split(" . ") if value else []
                if s.value == ("verdict",):
                    vparts = [value] if value else []
                if len(vparts) != len(s.value):
                    raise Refused(f"datatype mismatch: {value!r} for a value of "
                                  f"{' . '.join(s.value)}")  # fmt: skip
                for typ, part in zip(s.value, vparts, strict=True):
                    _check_value(typ, part, frozenset())
            elif value:
                raise Refused(f"set element {key!r} has a value")
            out.append((key, value))
        return out

    def _add_element(self, t: Table, name: str, spec: str) -> None:
        s = self._set(t, name, "element")
        for key, value in self._elements(s, spec):
            for target in _VERDICT_TARGET.findall(value):
                self._jump_target(t, target)
            s.elements[key] = value

    def _delete_element(self, t: Table, name: str, spec: str) -> None:
        s = self._set(t, name, "element")
        body = spec.strip()
        for item in body[1:-1].split(" , "):
            key = re.sub(r' comment "[^"]*"', "", item.partition(" : ")[0]).strip()
            if s.elements.pop(key, None) is None:
                raise Refused(f"No such file or directory: element {key} of {name}")
