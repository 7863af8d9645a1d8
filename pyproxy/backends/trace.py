"""``pyproxy trace``: what a backend's rendered rules do with the first packet of a connection.

A backend walks its own rendered objects (iptables chains, nftables chains and maps, virtual
servers), not a model of the whole kernel: the result says which of pyproxy's rules the packet
matches, the endpoints it can reach with their probabilities, whether it is masqueraded, and
where pyproxy drops or rejects it. Pure: the walk reads the render, never the kernel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from pyproxy.model.types import IPAddress, IPFamily, Protocol

DNAT = "dnat"
REJECT = "reject"
DROP = "drop"
ACCEPT = "accept"
"""The packet leaves pyproxy's rules unchanged (it is not a service's, or it is let through)."""
RELAY = "relay"
"""Userspace mode: redirected to the in-process relay, which connects to the endpoint."""
SOCKET = "socket"
"""ebpf mode: the socket is connected straight to the endpoint by a cgroup program (no NAT)."""
VERDICTS = (DNAT, RELAY, SOCKET, REJECT, DROP, ACCEPT)
FORWARDED = (DNAT, RELAY, SOCKET)
"""The verdicts that reach an endpoint."""
AFFINITY_NOTE = ("session affinity: a client seen within the timeout goes back to its "
                 "endpoint; this trace is of a client not seen yet")  # fmt: skip


class TraceError(Exception):
    """A rendered rule the walk does not know how to follow (a bug to report, not a verdict)."""


@dataclass(frozen=True)
class Packet:
    """The first packet of a connection from ``src`` to ``dst``:``port``."""

    src: IPAddress
    dst: IPAddress
    port: int
    protocol: Protocol = Protocol.TCP

    @property
    def family(self) -> IPFamily:
        return IPFamily.of(self.dst)


@dataclass
class Flow:
    """One branch of the walk: the packet as the rules have changed it so far."""

    dst: IPAddress
    port: int
    probability: float = 1.0
    mark: int = 0
    masquerade: bool = False
    dnat: bool = False
    verdict: str = ""
    redirect: str = ""
    """REDIRECT's --to-ports, as rendered."""
    steps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fork(self, probability: float) -> Flow:
        return replace(self, probability=probability, steps=list(self.steps),
                       notes=list(self.notes))  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """Where one branch ends."""

    verdict: str
    probability: float
    endpoint: str = ""
    """host:port after DNAT (or the relay's endpoint); "" when there is none."""
    masquerade: bool = False
    steps: tuple[str, ...] = ()
    """Each of pyproxy's rules the packet matched, in order, named in the mode's terms."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trace:
    packet: Packet
    mode: str
    outcomes: tuple[Outcome, ...]

    @property
    def endpoints(self) -> dict[str, float]:
        """Reachable endpoint -> probability (summed over the branches that reach it)."""
        out: dict[str, float] = {}
        for o in self.outcomes:
            if o.endpoint and o.verdict in FORWARDED:
                out[o.endpoint] = out.get(o.endpoint, 0.0) + o.probability
        return out

    @property
    def verdicts(self) -> set[str]:
        return {o.verdict for o in self.outcomes if o.probability > 0}


def outcome(flow: Flow) -> Outcome:
    """Where ``flow`` ended: its endpoint is where DNAT sent it (host:port), or what REDIRECT
    named."""
    host = f"[{flow.dst}]" if flow.dst.version == 6 else str(flow.dst)
    endpoint = flow.redirect or (f"{host}:{flow.port}" if flow.dnat else "")
    return Outcome(flow.verdict or ACCEPT, flow.probability, endpoint, flow.masquerade,
                   tuple(flow.steps), tuple(dict.fromkeys(flow.notes)))  # fmt: skip


_OBJECTS = (
    (re.compile(r"^-t (\S+) -A ([a-z]*[A-Z]+) "), ""),  # a built-in chain: not pyproxy's
    (re.compile(r"^-t (\S+) -A (\S+) "), "{0} chain {1}"),
    (re.compile(r"^chain (\S+): .*vmap @(\S+)\s+\[element (.*) : [^:]*\]$"),
     "chain {0}|map {1} element {2}"),
    (re.compile(r"^chain (\S+):"), "chain {0}"),
    (re.compile(r"^IPVS (\S+) (\S+) "), "virtual server {0} {1}"),
    (re.compile(r"^  -> (\S+) "), "real server {0}"),
    (re.compile(r"^relay (\S+):"), "relay listener of {0}"),
    (re.compile(r"^(\S+) program: services map (\S+) slot (\d+)"),
     "program {0}|socket map entry {1} slot {2}"),
)  # fmt: skip


def objects(steps: Iterable[str]) -> list[str]:
    """The mode's objects a walk went through (chains, map elements, virtual and real servers),
    in order, each once."""
    out: dict[str, None] = {}
    for step in steps:
        for pattern, form in _OBJECTS:
            if m := pattern.match(step):
                if form:
                    out.update(dict.fromkeys(form.format(*m.groups()).split("|")))
                break
    return list(out)
