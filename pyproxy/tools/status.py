"""``pyproxy status``: the daemon's own status (mode, last sync, pending changes, counts,
skipped objects; from its /debug/state) and per-service and per-endpoint traffic counters from
the programmed rules (iptables: rule counters, read with ``iptables-save -c`` through the kernel
layer; IPVS: virtual and real server statistics; nftables: the named counters
``--service-metrics`` adds; userspace: the daemon's relay).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from pyproxy.backends.base import ServiceTraffic, by_service_port
from pyproxy.backends.nftables.names import counted_port, is_service_counter
from pyproxy.backends.nftables.render import TABLE
from pyproxy.backends.xtables.counters import ServiceCounters, parse
from pyproxy.kernel.iptables import Iptables, IptablesError, detect_backend
from pyproxy.kernel.ipvs import IpvsError, Stats, statistics
from pyproxy.kernel.nft import Nft, NftError


class StatusError(Exception):
    """The kernel's counters cannot be read here (one line)."""


def read(iptables_backend: str) -> dict[str, ServiceCounters]:
    """iptables mode: every KUBE-SEP DNAT rule's and refusal rule's counters (IPv4)."""
    try:
        ipt = Iptables(detect_backend(iptables_backend, writes=False))
        return parse(ipt.save("nat", counters=True), ipt.save("filter", counters=True))
    except IptablesError as err:
        raise StatusError(str(err)) from None


def read_nft() -> dict[str, ServiceTraffic]:
    """nftables mode: the service ports' named counters (--service-metrics), both families."""
    nft = Nft()
    try:
        values = [(n, v) for family in ("ip", "ip6")
                  for n, v in nft.counters(family, TABLE).items()]  # fmt: skip
    except NftError as err:
        raise StatusError(str(err)) from None
    return by_service_port((counted_port(name), ServiceTraffic(p, p, b))
                           for name, (p, b) in values if is_service_counter(name))  # fmt: skip


def nft_report(seen: Mapping[str, ServiceTraffic]) -> str:
    if not seen:
        return ("no per-service counters in table kube-proxy (pyproxy counts per service in "
                "nftables mode with --service-metrics)\n")  # fmt: skip
    out = [f"{'SERVICE PORT':40} {'CONNECTIONS':>11} {'BYTES':>12}"]
    out += [f"{name:40} {t.connections:>11} {t.bytes or 0:>12}" for name, t in sorted(seen.items())]
    return "\n".join(out) + "\n"


def traffic_report(doc: Mapping[str, Mapping[str, int | None]]) -> str:
    """The daemon's /debug/traffic: per service port, what its mode counted."""
    out = ["per service port, as the daemon counts them:",
           f"  {'SERVICE PORT':40} {'CONNECTIONS':>11} {'PACKETS':>10} {'BYTES':>12}"]  # fmt: skip
    for name, t in sorted(doc.items()):
        packets = "-" if t.get("packets") is None else str(t["packets"])
        octets = "-" if t.get("bytes") is None else str(t["bytes"])
        out.append(f"  {name:40} {t['connections']:>11} {packets:>10} {octets:>12}")
    return "\n".join(out) + "\n"


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
    """Every virtual server's counters with its real servers'."""
    try:
        return statistics()
    except IpvsError as err:
        raise StatusError(str(err)) from None


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
