"""Per-service counters from iptables rule counters (iptables mode): the DNAT rule of each
KUBE-SEP chain counts the new connections (first packets: later ones follow conntrack) sent to
its endpoint, and the REJECT/DROP rules of the filter table count what was refused for want of
endpoints. Pure: parses ``iptables-save -c`` text."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

_COUNTED = re.compile(r"^\[(\d+):(\d+)\] -A (\S+) (.*)$")
_COMMENT = re.compile(r'--comment (?:"([^"]*)"|(\S+))')
_DEST = re.compile(r"--to-destination (\S+)")


@dataclass
class ServiceCounters:
    endpoints: dict[str, tuple[int, int]] = field(default_factory=dict)
    """endpoint -> (connections, bytes of those first packets)"""
    refused: int = 0
    dropped: int = 0

    @property
    def connections(self) -> int:
        return sum(p for p, _ in self.endpoints.values())

    @property
    def bytes(self) -> int:
        return sum(b for _, b in self.endpoints.values())


def dnat_counts(nat: str) -> dict[str, tuple[int, int]]:
    """Endpoint chain -> (connections, bytes) its DNAT rule counted, from ``iptables-save
    -c`` text of nat: what the daemon attributes through the chains it rendered."""
    out: dict[str, tuple[int, int]] = {}
    for line in nat.splitlines():
        m = _COUNTED.match(line)
        if m and m.group(3).startswith("KUBE-SEP-") and _DEST.search(m.group(4)):
            packets, octets = out.get(m.group(3), (0, 0))
            out[m.group(3)] = (packets + int(m.group(1)), octets + int(m.group(2)))
    return out


def parse(nat: str, filt: str) -> dict[str, ServiceCounters]:
    """Counters per service port name, from ``iptables-save -c`` text of nat and filter."""
    out: dict[str, ServiceCounters] = defaultdict(ServiceCounters)
    for line in nat.splitlines():
        m = _COUNTED.match(line)
        if not m or not m.group(3).startswith("KUBE-SEP-"):
            continue
        dest, comment = _DEST.search(m.group(4)), _COMMENT.search(m.group(4))
        if dest and comment:
            name = comment.group(1) or comment.group(2)
            packets, octets = out[name].endpoints.get(dest.group(1), (0, 0))
            out[name].endpoints[dest.group(1)] = (
                packets + int(m.group(1)),
                octets + int(m.group(2)),
            )
    for line in filt.splitlines():
        m = _COUNTED.match(line)
        comment = _COMMENT.search(m.group(4)) if m else None
        if not m or not comment:
            continue
        text = comment.group(1) or comment.group(2)
        for suffix, attr in (
            (" has no endpoints", "refused"),
            (" has no local endpoints", "dropped"),
        ):
            if text.endswith(suffix):
                svc = out[text[: -len(suffix)]]
                setattr(svc, attr, getattr(svc, attr) + int(m.group(1)))
    return dict(out)
