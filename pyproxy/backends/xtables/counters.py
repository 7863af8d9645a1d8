"""Per-service counters from iptables rule counters (iptables mode): the DNAT rule of each
KUBE-SEP chain counts the new connections (first packets: later ones follow conntrack) sent to
its endpoint, and the REJECT/DROP rules of the filter table count what was refused for want of
endpoints. Pure: parses ``iptables-save -c`` text."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

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


class _Dnat(NamedTuple):
    chain: str
    destination: str
    spec: str
    """The rule after its chain."""
    packets: int
    octets: int


def _dnat_rules(nat: str) -> Iterator[_Dnat]:
    """Each endpoint chain's DNAT rule with its counters, from ``iptables-save -c`` of nat."""
    for line in nat.splitlines():
        m = _COUNTED.match(line)
        if m and m.group(3).startswith("KUBE-SEP-") and (dest := _DEST.search(m.group(4))):
            yield _Dnat(m.group(3), dest.group(1), m.group(4), int(m.group(1)), int(m.group(2)))


def dnat_counts(nat: str) -> dict[str, tuple[int, int]]:
    """Endpoint chain -> (connections, bytes) its DNAT rule counted, from ``iptables-save
    -c`` text of nat: what the daemon attributes through the chains it rendered."""
    out: dict[str, tuple[int, int]] = {}
    for r in _dnat_rules(nat):
        packets, octets = out.get(r.chain, (0, 0))
        out[r.chain] = (packets + r.packets, octets + r.octets)
    return out


def parse(nat: str, filt: str) -> dict[str, ServiceCounters]:
    """Counters per service port name, from ``iptables-save -c`` text of nat and filter. The
    service port is read from the DNAT rule's comment: ``pyproxy status`` has no rendered
    table to ask (upstream leaves that comment out above 1,000 endpoints)."""
    out: dict[str, ServiceCounters] = defaultdict(ServiceCounters)
    for r in _dnat_rules(nat):
        comment = _COMMENT.search(r.spec)
        if comment:
            endpoints = out[comment.group(1) or comment.group(2)].endpoints
            packets, octets = endpoints.get(r.destination, (0, 0))
            endpoints[r.destination] = (packets + r.packets, octets + r.octets)
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
