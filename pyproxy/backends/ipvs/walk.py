"""``pyproxy trace`` in IPVS mode: the iptables rules walked as in iptables mode, their
``-m set`` matches answered from the rendered ipsets, and between the filter rules and nat
POSTROUTING the rendered virtual servers: a connection to a local address and port that has
one is scheduled to a real server (round robin: shares by weight). Pure."""

from __future__ import annotations

import ipaddress

from pyproxy.backends.ipvs.render import PROTO_NAME, PROTO_NUM, Desired, iptables_chains
from pyproxy.backends.trace import AFFINITY_NOTE, DNAT, REJECT, Flow, Outcome, Packet
from pyproxy.backends.xtables.rules import JumpRule
from pyproxy.backends.xtables.walk import Walker
from pyproxy.model.types import IPAddress

_SHARED = ("rr", "wrr")
"""Schedulers whose shares follow the weights; the others decide per connection."""


class IpvsWalk:
    def __init__(self, desired: Desired, jumps: tuple[JumpRule, ...], local: tuple[IPAddress, ...],
                 mark: str, family_set_types: dict[str, str]) -> None:  # fmt: skip
        self.d = desired
        self.types = family_set_types
        on_dummy = (ipaddress.ip_address(a) for a in desired.addresses)
        tables = iptables_chains(desired.iptables)
        self.walker = Walker(tables, jumps, (*local, *on_dummy), mark, self.in_set)

    def in_set(self, name: str, flags: str, packet: Packet, flow: Flow) -> bool:
        """ipset membership as the kernel decides it for ``-m set --match-set NAME FLAGS``."""
        members = self.d.ipsets.get(name, set())
        proto = packet.protocol.value.lower()
        if self.types.get(name, "").startswith("bitmap:port"):
            return (flow.port,) in members
        if flags == "dst":  # hash:ip
            return (str(flow.dst),) in members
        port = f"{proto}:{flow.port}"
        if flags == "dst,dst":
            return (str(flow.dst), port) in members
        if flags == "dst,dst,src" and self.types.get(name) == "hash:ip,port,ip":
            return (str(flow.dst), port, str(packet.src)) in members
        if flags == "dst,dst,src":  # hash:ip,port,net
            return any(m[0] == str(flow.dst) and m[1] == port
                       and packet.src in ipaddress.ip_network(str(m[2]), strict=False)
                       for m in members)  # fmt: skip
        return False

    def virtual_server(self, packet: Packet, f: Flow) -> list[Flow]:
        if not self.walker.is_local(f.dst):
            return [f]
        key = (PROTO_NUM[packet.protocol], str(f.dst), f.port)
        vs = self.d.services.get(key)
        if vs is None:
            return [f]
        host = f"[{f.dst}]" if f.dst.version == 6 else str(f.dst)
        flags = f" persistent {vs.timeout}" if vs.timeout else ""
        step = f"IPVS {PROTO_NAME[key[0]]} {host}:{f.port} {vs.scheduler}{flags}   # {vs.comment}"
        f.steps.append(step)
        dests = {d: w for d, w in sorted(vs.dests.items()) if w > 0}
        if not dests:
            f.verdict = REJECT
            f.notes.append("no real server: IPVS answers with ICMP port unreachable")
            return [f]
        total = sum(dests.values())
        out = []
        for (ip, port), weight in dests.items():
            g = f.fork(f.probability * weight / total)
            g.dst, g.port, g.dnat, g.verdict = ipaddress.ip_address(ip), port, True, DNAT
            g.steps.append(f"  -> {ip}:{port}  Masq  weight {weight}")
            if vs.timeout:
                g.notes.append(AFFINITY_NOTE)
            if vs.scheduler not in _SHARED:
                g.notes.append(f"scheduler {vs.scheduler} picks per connection; the share "
                               "shown is by weight")  # fmt: skip
            out.append(g)
        return out

    def walk(self, packet: Packet) -> list[Outcome]:
        return self.walker.walk(packet, self.virtual_server)
