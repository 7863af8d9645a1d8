"""An nftables rule as data: its expressions in order (conditions, then statements) and its
comment. The render builds these; ``nft -f`` text is made from them only at the kernel edge
(``Rule.text``), and ``trace`` evaluates the expressions themselves. Only the expressions
kube-proxy's table uses exist. Pure: no kernel."""

from __future__ import annotations

from dataclasses import dataclass

from pyproxy.model.types import Endpoint


@dataclass(frozen=True, slots=True)
class SetRef:
    """``@NAME``: membership in a named set or map."""

    name: str

    @property
    def text(self) -> str:
        return f"@{self.name}"


@dataclass(frozen=True, slots=True)
class AnonSet:
    """``{ a, b }``: an anonymous set of addresses or prefixes."""

    values: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"{{ {', '.join(self.values)} }}"


@dataclass(frozen=True, slots=True)
class Match:
    """``KEY [. KEY ...] [!=] VALUE``: the packet's keys (``ip daddr``, ``meta l4proto``,
    ``th dport``, concatenated with ``.``) against a literal, a named set or an anonymous
    set."""

    keys: tuple[str, ...]
    value: str | SetRef | AnonSet
    negated: bool = False

    @property
    def text(self) -> str:
        value = self.value if isinstance(self.value, str) else self.value.text
        return f"{' . '.join(self.keys)} {'!= ' if self.negated else ''}{value}"


@dataclass(frozen=True, slots=True)
class Fib:
    """``fib saddr type local`` / ``fib daddr type local``: the address is the node's."""

    which: str

    @property
    def text(self) -> str:
        return f"fib {self.which} type local"


@dataclass(frozen=True, slots=True)
class Ct:
    """``ct state new`` / ``ct status dnat``."""

    what: str
    value: str

    @property
    def text(self) -> str:
        return f"ct {self.what} {self.value}"


@dataclass(frozen=True, slots=True)
class MarkTest:
    """``mark and MASK != 0``: the masquerade bit is set."""

    mask: str

    @property
    def text(self) -> str:
        return f"mark and {self.mask} != 0"


@dataclass(frozen=True, slots=True)
class SetMark:
    """``mark set mark or|xor VALUE``."""

    op: str
    value: str

    @property
    def text(self) -> str:
        return f"mark set mark {self.op} {self.value}"


@dataclass(frozen=True, slots=True)
class Counter:
    """``counter`` (anonymous) or ``counter name "NAME"``."""

    name: str = ""

    @property
    def text(self) -> str:
        return f'counter name "{self.name}"' if self.name else "counter"


@dataclass(frozen=True, slots=True)
class Update:
    """``update @SET { KEY }``: remember the client (session affinity)."""

    set: str
    key: str

    @property
    def text(self) -> str:
        return f"update @{self.set} {{ {self.key} }}"


@dataclass(frozen=True, order=True, slots=True)
class Verdict:
    """``accept``, ``drop``, ``reject``, ``return``, ``jump CHAIN`` or ``goto CHAIN``: in a
    rule, or as a verdict map's value."""

    kind: str
    chain: str = ""

    @property
    def text(self) -> str:
        return f"{self.kind} {self.chain}" if self.chain else self.kind


@dataclass(frozen=True, slots=True)
class Vmap:
    """``KEY [. KEY ...] vmap @MAP``: the verdict the map holds for the packet's keys."""

    keys: tuple[str, ...]
    map: str

    @property
    def text(self) -> str:
        return f"{' . '.join(self.keys)} vmap @{self.map}"


@dataclass(frozen=True, slots=True)
class NumgenVmap:
    """``numgen random mod N vmap { 0 : V0 , ... }``: one of the verdicts, equally likely."""

    verdicts: tuple[Verdict, ...]

    @property
    def text(self) -> str:
        pairs = " , ".join(f"{i} : {v.text}" for i, v in enumerate(self.verdicts))
        return f"numgen random mod {len(self.verdicts)} vmap {{ {pairs} }}"


@dataclass(frozen=True, slots=True, eq=False)
class Dnat:
    """``dnat to ADDR:PORT``, or with several targets ``dnat ip addr . port to numgen random
    mod N map { 0 : ADDR . PORT , ... }`` (``ip6`` for IPv6). ``single`` keeps the first
    form for one target (the endpoint chains of affinity)."""

    family: str
    targets: tuple[Endpoint, ...]
    """The state's own endpoint objects, not their text: a large table has one target per
    endpoint. Only their address and port are the rule's (equality compares those)."""
    single: bool = False

    def _key(self) -> tuple[object, ...]:
        return (self.family, self.single, tuple((t.ip, t.port) for t in self.targets))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dnat) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def text(self) -> str:
        if self.single:
            return f"dnat to {self.targets[0].hostport}"
        pairs = " , ".join(f"{i} : {t.ip} . {t.port}" for i, t in enumerate(self.targets))
        n = len(self.targets)
        return f"dnat {self.family} addr . port to numgen random mod {n} map {{ {pairs} }}"


@dataclass(frozen=True, slots=True)
class Masquerade:
    @property
    def text(self) -> str:
        return "masquerade fully-random"


Expr = (
    Match | Fib | Ct | MarkTest | SetMark | Counter | Update | Verdict | Vmap | NumgenVmap | Dnat
    | Masquerade
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Rule:
    exprs: tuple[Expr, ...]
    comment: str = ""

    @property
    def text(self) -> str:
        """The rule as ``nft`` reads it after ``add rule FAMILY TABLE CHAIN``. Made when
        asked, not kept: a full sync writes each rule once."""
        body = " ".join(e.text for e in self.exprs)
        return f'{body} comment "{self.comment}"' if self.comment else body
