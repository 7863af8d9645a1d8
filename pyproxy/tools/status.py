"""``pyproxy status``: the daemon's own status (mode, last sync, pending changes, counts,
skipped objects; from its /debug/state) and per-service and per-endpoint traffic counters from
the programmed rules.

iptables mode keeps a packet/byte counter on every rule; the DNAT rule of each KUBE-SEP chain
counts the new connections (first packets, since later ones follow conntrack) sent to that
endpoint, and the REJECT/DROP rules count what was refused for want of endpoints. Read with
``iptables-save -c`` through the kernel layer, so it works on both back ends.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyproxy.kernel.iptables import Iptables
from pyproxy.kernel.ipvs import Ipvs, Stats

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


def read(ipt: Iptables) -> dict[str, ServiceCounters]:
    return parse(ipt.save("nat", counters=True), ipt.save("filter", counters=True))


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


def summary(state: dict[str, Any]) -> str:
    """The daemon's own status, from its /debug/state document."""
    last = state.get("lastSync") or {}
    when = (
        datetime.fromtimestamp(last["finished"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if last.get("finished")
        else "never"
    )
    services = state.get("services", {})
    ports = [p for ps in services.values() for p in ps]
    endpoints = sum(len(p.get("endpoints", ())) for p in ports)
    pending = state.get("pending", {})
    out = [
        f"mode: {state.get('mode')}   node: {state.get('nodeName')}",
        "last sync: "
        + (
            f"{'full' if last.get('full') else 'partial'}, {when}, {last.get('seconds', 0):.3f}s, "
            + ("ok" if last.get("ok") else f"FAILED: {last.get('error')}")
            if last
            else "none yet"
        ),
        f"syncs: {state.get('syncs', 0)} ({state.get('fullSyncs', 0)} full, "
        f"{state.get('failedSyncs', 0)} failed)",
        f"pending: {pending.get('serviceChanges', 0)} service, "
        f"{pending.get('endpointChanges', 0)} endpoint changes",
        f"services: {len(services)}   service ports: {len(ports)}   endpoints: {endpoints}",
    ]
    skipped = state.get("skippedCounts") or {}
    out.append(
        "skipped objects: "
        + (", ".join(f"{n} {k}" for k, n in sorted(skipped.items())) if skipped else "none")
    )
    out += [f"  {s['kind']} {s['object']}: {s['reason']}" for s in state.get("skipped", [])[-10:]]
    return "\n".join(out) + "\n"


PROTOCOL_NAMES = {6: "TCP", 17: "UDP", 132: "SCTP"}


def ipvs_report(stats: Mapping[tuple[int, str, int], tuple[Stats, Mapping[tuple[str, int], Stats]]]
                ) -> str:  # fmt: skip
    """IPVS mode: what the kernel counted per virtual server and real server (ipvsadm -Ln
    --stats, from netlink)."""
    if not stats:
        return "no IPVS virtual servers in this network namespace\n"

    def hostport(addr: str, port: int) -> str:
        return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"

    head = f"{'VIRTUAL SERVER / REAL SERVER':36} {'CONNS':>8} {'INPKTS':>10} {'OUTPKTS':>10} "
    out = [head + f"{'INBYTES':>12} {'OUTBYTES':>12}"]
    for (proto, addr, port), (vs, dests) in sorted(stats.items()):
        rows = [(f"{PROTOCOL_NAMES.get(proto, proto)} {hostport(addr, port)}", vs)]
        rows += [(f"  -> {hostport(*d)}", s) for d, s in sorted(dests.items())]
        for name, s in rows:
            out.append(f"{name:36} {s.connections:>8} {s.packets_in:>10} {s.packets_out:>10} "
                       f"{s.bytes_in:>12} {s.bytes_out:>12}")  # fmt: skip
    return "\n".join(out) + "\n"


def read_ipvs() -> dict[tuple[int, str, int], tuple[Stats, dict[tuple[str, int], Stats]]]:
    """Every virtual server's counters with its real servers' (raises IpvsError)."""
    sock = Ipvs()
    try:
        return sock.statistics()
    finally:
        sock.close()


def ipvs_doc(
    stats: Mapping[tuple[int, str, int], tuple[Stats, Mapping[tuple[str, int], Stats]]],
) -> list[dict[str, Any]]:
    """``status -o json`` in IPVS mode."""
    return [
        {"protocol": k[0], "address": k[1], "port": k[2], **asdict(vs),
         "realServers": [{"address": d[0], "port": d[1], **asdict(ds)}
                         for d, ds in sorted(dests.items())]}
        for k, (vs, dests) in sorted(stats.items())
    ]  # fmt: skip
