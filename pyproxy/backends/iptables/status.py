"""``pyproxy status`` in iptables mode: every KUBE-SEP DNAT rule's and refusal rule's
counters, read with ``iptables-save -c`` through the kernel layer."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pyproxy.backends.base import BackendUnavailable
from pyproxy.backends.xtables.counters import ServiceCounters, parse
from pyproxy.kernel.iptables import Iptables, IptablesError, detect_backend


def counters(iptables_backend: str) -> tuple[str, Any, str]:
    """("counters", per service port its connections per endpoint, the text report)."""
    seen = read(iptables_backend)
    return "counters", {k: asdict(v) for k, v in seen.items()}, report(seen)


def read(iptables_backend: str) -> dict[str, ServiceCounters]:
    """iptables mode: every KUBE-SEP DNAT rule's and refusal rule's counters (IPv4)."""
    try:
        ipt = Iptables(detect_backend(iptables_backend, writes=False))
        return parse(ipt.save("nat", counters=True), ipt.save("filter", counters=True))
    except IptablesError as err:
        raise BackendUnavailable(str(err)) from None


def report(counters: dict[str, ServiceCounters]) -> str:
    if not counters:
        return "no pyproxy service rules found in this network namespace\n"
    out = [f"{'SERVICE PORT':40} {'ENDPOINT':24} {'CONNECTIONS':>11}"]
    for name in sorted(counters):
        c = counters[name]
        out.append(
            f"{name:40} {'(total)':24} {c.connections:>11}"
            + (f"   refused {c.refused}" if c.refused else "")
            + (f"   dropped {c.dropped}" if c.dropped else "")
        )
        for ep, (packets, _) in sorted(c.endpoints.items()):
            out.append(f"{'':40} {ep:24} {packets:>11}")
    return "\n".join(out) + "\n"
