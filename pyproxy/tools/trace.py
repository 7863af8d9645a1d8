"""``pyproxy trace``: a backend's walk of the first packet of a connection, as text or JSON."""

from __future__ import annotations

import json
from dataclasses import asdict

from pyproxy.backends.trace import DNAT, DROP, REJECT, RELAY, SOCKET, Outcome, Trace

_WHAT = {
    DNAT: "DNAT to {ep}",
    RELAY: "relayed to {ep}",
    SOCKET: "connected to {ep} at the socket (no NAT, no conntrack entry for the service)",
    REJECT: "REJECTED (the client is refused)",
    DROP: "DROPPED (silently)",
}


def _verdict(o: Outcome) -> str:
    text = _WHAT.get(o.verdict, "not handled by pyproxy: leaves its rules unchanged")
    text = text.format(ep=o.endpoint)
    if o.verdict == RELAY:
        text += ", from the node's address"
    elif o.verdict == DNAT:
        text += ", masqueraded" if o.masquerade else ", source IP kept"
    return text


def report(trace: Trace, output: str = "text") -> str:
    p = trace.packet
    if output == "json":
        doc = {"packet": {"from": str(p.src), "to": str(p.dst), "port": p.port,
                          "protocol": p.protocol.value},
               "mode": trace.mode, "endpoints": trace.endpoints,
               "outcomes": [asdict(o) for o in trace.outcomes]}  # fmt: skip
        return json.dumps(doc, indent=1) + "\n"
    out = [f"{p.protocol.value} {p.src} -> {p.dst}:{p.port} ({trace.mode} mode)"]
    shared = _common_prefix([o.steps for o in trace.outcomes])
    out += [f"  {s}" for s in shared]
    for o in trace.outcomes:
        out.append(f"  => {o.probability:.1%}: {_verdict(o)}")
        out += [f"       {s}" for s in o.steps[len(shared) :]]
        out += [f"     note: {n}" for n in o.notes]
    return "\n".join(out) + "\n"


def _common_prefix(paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    if len(paths) < 2:
        return ()
    n = 0
    while all(len(p) > n and p[n] == paths[0][n] for p in paths):
        n += 1
    return paths[0][:n]
