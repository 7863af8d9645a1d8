"""An iptables rule as data: the chain, its conditions in order, and its target. Every mode
that writes iptables renders these; the text (iptables-restore or iptables-save syntax) and the
argument vector (``iptables -I``) are made from them only at the kernel edge, and ``trace``
reads their conditions directly. Pure: no kernel."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import NamedTuple


def quote(text: str) -> str:
    """Quote a comment as iptables-save does: only when it contains a space."""
    return f'"{text}"' if " " in text else text


class Module(NamedTuple):
    """``-m NAME``: loads the match extension whose options follow."""

    name: str

    def words(self) -> list[str]:
        return ["-m", self.name]


class Match(NamedTuple):
    """One condition: ``[!] OPTION [VALUE]`` (``-d 10.96.0.1``, ``--dport 80``, ``--rcheck``).
    ``--match-set``'s value is its two words, the set and its flags."""

    option: str
    value: str = ""
    negated: bool = False

    def words(self) -> list[str]:
        out = ["!", self.option] if self.negated else [self.option]
        if self.option == "--match-set":
            out += self.value.split(" ")
        elif self.value:
            out.append(self.value)
        return out


Part = Module | Match


class Rule(NamedTuple):
    """``-A CHAIN PARTS -j TARGET ARGS`` (``-g`` when ``goto``). No target: the rule only
    counts (upstream's last KUBE-FW rule). Tuples, not objects with a ``__dict__``: a large
    table holds hundreds of thousands of them, and they are compared and hashed in a
    partial sync."""

    chain: str
    parts: tuple[Part, ...] = ()
    target: str = ""
    target_args: tuple[str, ...] = ()
    """The target's options as words: ``("--to-destination", "10.1.0.5:80")``. Flat, not
    pairs: a large table has one per endpoint."""
    goto: bool = False

    @property
    def matches(self) -> Iterable[Match]:
        return (p for p in self.parts if isinstance(p, Match))

    def argv(self) -> list[str]:
        """Everything after the chain as an argument vector (``iptables -I``): nothing quoted.
        Restore text is ``spec``."""
        out: list[str] = []
        for p in self.parts:
            out += p.words()
        if self.target:
            out += ["-g" if self.goto else "-j", self.target]
        out += self.target_args
        return out

    def target_option(self, option: str) -> str | None:
        """The value of one of the target's options (``--to-destination``); None if absent."""
        args = self.target_args
        for i, word in enumerate(args[:-1]):
            if word == option:
                return args[i + 1]
        return None

    @property
    def spec(self) -> str:
        """The rule after its chain, as iptables-save prints it. Written out inline: a full
        sync at 10,000 services turns about 230,000 rules into text."""
        out: list[str] = []
        add = out.append
        for p in self.parts:
            if len(p) == 1:  # a Module
                add("-m")
                add(p[0])
                continue
            option, value, negated = p  # a Match
            if negated:
                add("!")
            add(option)
            if option == "--comment":
                add(quote(value))
            elif value:
                add(value)  # --match-set's two words are one string: joined the same
        if self.target:
            add("-g" if self.goto else "-j")
            add(self.target)
        out += self.target_args
        return " ".join(out)

    @property
    def text(self) -> str:
        """``-A CHAIN ...``: one line of iptables-restore input."""
        spec = self.spec
        return f"-A {self.chain} {spec}" if spec else f"-A {self.chain}"


@functools.cache
def module(name: str) -> Module:
    """One shared ``Module`` per name: a large table has hundreds of thousands of rules."""
    return Module(name)


@functools.cache
def fixed(option: str, value: str = "", negated: bool = False) -> Match:
    """One shared ``Match`` for a condition many rules carry (``-p tcp``, ``--set``)."""
    return Match(option, value, negated)


def comment(text: str) -> tuple[Part, ...]:
    return (module("comment"), Match("--comment", text))


def match_set(name: str, flags: str) -> tuple[Part, ...]:
    return (module("set"), Match("--match-set", f"{name} {flags}"))


def ctstate(states: str, negated: bool = False) -> tuple[Part, ...]:
    return (module("conntrack"), fixed("--ctstate", states, negated))


def addrtype(option: str, kind: str = "LOCAL") -> tuple[Part, ...]:
    """``-m addrtype --dst-type LOCAL`` / ``--src-type LOCAL``."""
    return (module("addrtype"), fixed(option, kind))


def mark(value: str, negated: bool = False) -> tuple[Part, ...]:
    return (module("mark"), fixed("--mark", value, negated))


def dport(proto: str, port: int, dest: str | None = None) -> tuple[Part, ...]:
    """``-m tcp -p tcp [-d DEST] --dport PORT``, in upstream's order."""
    if dest is None:
        return (module(proto), fixed("-p", proto), Match("--dport", str(port)))
    return (module(proto), fixed("-p", proto), Match("-d", dest), Match("--dport", str(port)))


def by_chain(rules: Iterable[Rule], declared: Iterable[str] = ()) -> dict[str, list[Rule]]:
    """chain -> its rules, in order; every ``declared`` chain is there, empty or not."""
    out: dict[str, list[Rule]] = {c: [] for c in declared}
    for r in rules:
        out.setdefault(r.chain, []).append(r)
    return out
