"""Rules shared by every mode that writes iptables rules; pure (no kernel)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pyproxy.backends.xtables.rule import (
    Match,
    Part,
    Rule,
    comment,
    ctstate,
    mark,
)
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.types import IPFamily, IPNetwork

KUBE_MARK_MASQ = "KUBE-MARK-MASQ"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_PROXY_CANARY = "KUBE-PROXY-CANARY"
CANARY_TABLES = ("mangle", "nat", "filter")
NEW = ctstate("NEW")


@dataclass(frozen=True)
class XtablesConfig:
    """Render settings for one IP family that every iptables-writing mode shares, fixed at
    start from the ProxyConfig."""

    family: IPFamily = IPFamily.IPV4
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    random_fully: bool = True
    conntrack_tcp_liberal: bool = False

    @property
    def mark(self) -> str:
        return self.proxy.masquerade.mark


@dataclass(frozen=True)
class JumpRule:
    """A rule in a built-in chain (INPUT, PREROUTING, ...) that leads to a mode's own chain.

    Written with ``iptables -I`` rather than iptables-restore, so the rest of the built-in
    chain, which belongs to other programs, is never rewritten."""

    table: str
    chain: str
    target: str
    comment: str = ""
    match: tuple[Part, ...] = ()

    def rule(self) -> Rule:
        return Rule(self.chain, (*self.match, *(comment(self.comment) if self.comment else ())),
                    self.target)  # fmt: skip

    def args(self) -> list[str]:
        """The argument vector after the chain (``iptables -I CHAIN 1 ARGS``)."""
        return self.rule().argv()


def mark_masq_rules(mark_bit: str) -> list[Rule]:
    return [Rule(KUBE_MARK_MASQ, (), "MARK", ("--or-mark", mark_bit))]


def postrouting_rules(mark_bit: str, random_fully: bool) -> list[Rule]:
    """Masquerade what KUBE-MARK-MASQ marked, clearing the mark first (upstream's layout)."""
    return [
        Rule(KUBE_POSTROUTING, mark(f"{mark_bit}/{mark_bit}", negated=True), "RETURN"),
        Rule(KUBE_POSTROUTING, (), "MARK", ("--xor-mark", mark_bit)),
        Rule(KUBE_POSTROUTING, comment("kubernetes service traffic requiring SNAT"),
             "MASQUERADE", ("--random-fully",) if random_fully else ()),
    ]  # fmt: skip


def forward_rules(mark_bit: str, conntrack_tcp_liberal: bool) -> list[Rule]:
    out = [] if conntrack_tcp_liberal else [Rule(KUBE_FORWARD, ctstate("INVALID"), "DROP")]
    return [
        *out,
        Rule(KUBE_FORWARD, (*comment("kubernetes forwarding rules"),
                            *mark(f"{mark_bit}/{mark_bit}")), "ACCEPT"),
        Rule(KUBE_FORWARD, (*comment("kubernetes forwarding conntrack rule"),
                            *ctstate("RELATED,ESTABLISHED")), "ACCEPT"),
    ]  # fmt: skip


def if_not_local(local_cidrs: Sequence[IPNetwork]) -> tuple[Part, ...] | None:
    """The match for traffic not from this cluster's pods, or None when no local CIDR is
    known (upstream's LocalTrafficDetector.IfNotLocal / IsImplemented)."""
    if not local_cidrs:
        return None
    return (Match("-s", str(local_cidrs[0]), negated=True),)


def if_local(local_cidrs: Sequence[IPNetwork]) -> tuple[Part, ...] | None:
    if not local_cidrs:
        return None
    return (Match("-s", str(local_cidrs[0])),)


def restore_text(tables: Sequence[tuple[str, Sequence[str], Sequence[Rule]]]) -> str:
    """iptables-restore input: per table, chain declarations then rules."""
    out: list[str] = []
    for table, chains, rules in tables:
        out += [f"*{table}", *(f":{c} - [0:0]" for c in chains), *(r.text for r in rules)]
        out.append("COMMIT")
    return "\n".join(out) + "\n"
