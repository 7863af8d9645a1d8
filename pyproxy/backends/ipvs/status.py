"""``pyproxy status`` in IPVS mode: what the kernel counted per virtual and real server
(``ipvsadm -Ln --stats``, from netlink)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from pyproxy.backends.base import BackendUnavailable
from pyproxy.kernel.ipvs import IpvsError, Stats, statistics


def counters() -> tuple[str, Any, str]:
    """("ipvs", every virtual server with its real servers, the text report)."""
    stats = read_ipvs()
    return "ipvs", ipvs_doc(stats), ipvs_report(stats)


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
        raise BackendUnavailable(str(err)) from None


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
