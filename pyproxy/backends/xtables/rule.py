"""An iptables rule as data: the chain, its conditions in order, and its target. Every mode
that writes iptables renders these; the text (iptables-restore or iptables-save syntax) and the
argument vector (``iptables -I``) are made from them only at the kernel edge, and ``trace``
reads their conditions directly. Pure: no kernel."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property


def quote(text: str) -> str:
    """Quote a comment as iptables-save does: only when it contains a space."""
    return f'"{text}"' if " " in text else text


@dataclass(frozen=True)
class Module:
    """``-m NAME``: loads the match extension whose options follow."""

    name: str

    def words(self, quoted: bool) -> list[str]:
        return ["-m", self.name]


@dataclass(frozen=True)
class Match:
    """One condition: ``[!] OPTION [VALUE]`` (``-d 10.96.0.1``, ``--dport 80``, ``--rcheck``).
    ``--match-set``'s value is its two words, the set and its flags."""

    option: str
    value: str = ""
    negated: bool = False

    def words(self, quoted: bool) -> list[str]:
        out = ["!"] if self.negated else []
        out.append(self.option)
        if self.option == "--match-set":
            out += self.value.split(" ")
        elif self.option == "--comment":
            out.append(quote(self.value) if quoted else self.value)
        elif self.value:
            out.append(self.value)
        return out


Part = Module | Match


@dataclass(frozen=True)
class Rule:
    """``-A CHAIN PARTS -j TARGET ARGS`` (``-g`` when ``goto``). No target: the rule only
    counts (upstream's last KUBE-FW rule)."""

    chain: str
    parts: tuple[Part, ...] = ()
    target: str = ""
    target_args: tuple[tuple[str, str], ...] = ()
    goto: bool = False

    @property
    def matches(self) -> Iterable[Match]:
        return (p for p in self.parts if isinstance(p, Match))

    def argv(self, quoted: bool = False) -> list[str]:
        """Everything after the chain: quoted for restore input, not for an argument vector."""
        out = [w for p in self.parts for w in p.words(quoted)]
        if self.target:
            out += ["-g" if self.goto else "-j", self.target]
        for option, value in self.target_args:
            out += [option, value] if value else [option]
        return out

    @cached_property
    def spec(self) -> str:
        """The rule after its chain, as iptables-save prints it."""
        return " ".join(self.argv(quoted=True))

    @cached_property
    def text(self) -> str:
        """``-A CHAIN ...``: one line of iptables-restore input."""
        return f"-A {self.chain} {self.spec}" if self.spec else f"-A {self.chain}"


def comment(text: str) -> tuple[Part, ...]:
    return (Module("comment"), Match("--comment", text))


def match_set(name: str, flags: str) -> tuple[Part, ...]:
    return (Module("set"), Match("--match-set", f"{name} {flags}"))


def ctstate(states: str, negated: bool = False) -> tuple[Part, ...]:
    return (Module("conntrack"), Match("--ctstate", states, negated))


def addrtype(option: str, kind: str = "LOCAL") -> tuple[Part, ...]:
    """``-m addrtype --dst-type LOCAL`` / ``--src-type LOCAL``."""
    return (Module("addrtype"), Match(option, kind))


def mark(value: str, negated: bool = False) -> tuple[Part, ...]:
    return (Module("mark"), Match("--mark", value, negated))


def dport(proto: str, port: int, dest: str | None = None) -> tuple[Part, ...]:
    """``-m tcp -p tcp [-d DEST] --dport PORT``, in upstream's order."""
    head: tuple[Part, ...] = (Module(proto), Match("-p", proto))
    where = (Match("-d", dest),) if dest is not None else ()
    return (*head, *where, Match("--dport", str(port)))


def by_chain(rules: Iterable[Rule], declared: Iterable[str] = ()) -> dict[str, list[Rule]]:
    """chain -> its rules, in order; every ``declared`` chain is there, empty or not."""
    out: dict[str, list[Rule]] = {c: [] for c in declared}
    for r in rules:
        out.setdefault(r.chain, []).append(r)
    return out
