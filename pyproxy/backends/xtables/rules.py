"""Rule text shared by every mode that writes iptables rules; pure (no kernel)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pyproxy.config.settings import ProxyConfig
from pyproxy.model.types import IPFamily, IPNetwork

KUBE_MARK_MASQ = "KUBE-MARK-MASQ"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_PROXY_CANARY = "KUBE-PROXY-CANARY"
CANARY_TABLES = ("mangle", "nat", "filter")
NEW = ("-m", "conntrack", "--ctstate", "NEW")


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
    match: tuple[str, ...] = ()

    def args(self) -> list[str]:
        comment = ["-m", "comment", "--comment", self.comment] if self.comment else []
        return [*self.match, *comment, "-j", self.target]


def quote(text: str) -> str:
    """Quote a comment as upstream does: only when it contains a space."""
    return f'"{text}"' if " " in text else text


def mark_masq_rules(mark: str) -> list[str]:
    return [f"-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}"]


def postrouting_rules(mark: str, random_fully: bool) -> list[str]:
    """Masquerade what KUBE-MARK-MASQ marked, clearing the mark first (upstream's layout)."""
    return [
        f"-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN",
        f"-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}",
        f'-A {KUBE_POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT"'
        " -j MASQUERADE" + (" --random-fully" if random_fully else ""),
    ]


def forward_rules(mark: str, conntrack_tcp_liberal: bool) -> list[str]:
    out = (
        []
        if conntrack_tcp_liberal
        else [f"-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP"]
    )
    return [
        *out,
        f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding rules"'
        f" -m mark --mark {mark}/{mark} -j ACCEPT",
        f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding conntrack rule"'
        " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ]


def if_not_local(local_cidrs: Sequence[IPNetwork]) -> list[str] | None:
    """The match for traffic not from this cluster's pods, or None when no local CIDR is
    known (upstream's LocalTrafficDetector.IfNotLocal / IsImplemented)."""
    if not local_cidrs:
        return None
    return ["!", "-s", str(local_cidrs[0])]


def if_local(local_cidrs: Sequence[IPNetwork]) -> list[str] | None:
    if not local_cidrs:
        return None
    return ["-s", str(local_cidrs[0])]


def restore_text(tables: Sequence[tuple[str, Sequence[str], Sequence[str]]]) -> str:
    """iptables-restore input: per table, chain declarations then lines."""
    out: list[str] = []
    for table, chains, lines in tables:
        out += [f"*{table}", *(f":{c} - [0:0]" for c in chains), *lines, "COMMIT"]
    return "\n".join(out) + "\n"
