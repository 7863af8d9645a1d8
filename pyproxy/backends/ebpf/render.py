"""What the socket programs balance: for each service port, the addresses a process on this
node connects to and the endpoints it is connected to instead. Pure.

The choice follows upstream's rules for traffic that starts on the node, so a connection goes
where kube-proxy's DNAT would send it:
- the cluster IP, to the endpoints of the internal traffic policy (``sel.internal``);
- external IPs, load-balancer IPs and NodePorts on this node's addresses (those
  ``--nodeport-addresses`` chooses, as IPVS mode lists them), to the cluster's endpoints:
  upstream's external chain sends pod and node traffic to the cluster chain whatever the
  external policy;
- not balanced here, and so left to the rules: a port without endpoints to use (the rules
  refuse or drop as upstream does), a port with ClientIP affinity unless ``affinity`` (the
  rules keep affinity in their own sets, which the programs cannot read: a client's
  connection that met the rules, made before the service's entry was written, and its next
  ones, met by the programs, would each have their own choice), load-balancer IPs with
  source ranges (the rules check them), NodePorts on another node's address or on loopback,
  and SCTP.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from pyproxy.backends.ebpf import layout
from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import Endpoint, IPAddress, IPFamily, NodeInfo, Protocol, ServicePort


def hostport(addr: IPAddress, port: int) -> str:
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"


@dataclass(frozen=True, slots=True)
class Balanced:
    """One service address (address, port, protocol) balanced at the socket."""

    addr: IPAddress
    port: int
    protocol: Protocol
    name: str
    """The service port (``ns/name:port``)."""
    endpoints: tuple[Endpoint, ...]
    affinity_timeout: int = 0
    """ClientIP affinity's timeout in seconds (0: none)."""

    @property
    def ident(self) -> int:
        """The service port's id in the affinity map: a hash of its name, so the render
        stays pure. Two ports sharing one only make a remembered endpoint be chosen again."""
        return zlib.crc32(self.name.encode())

    def entries(self) -> dict[bytes, bytes]:
        """Its ``services`` map entries: the head in slot 0, the endpoints in slots 1..n."""

        head, *slots = layout.keys(self.addr, self.port, self.protocol, len(self.endpoints))
        flags = layout.AFFINITY if self.affinity_timeout else 0
        out = {head: layout.head(len(self.endpoints), flags, self.affinity_timeout, self.ident)}
        for slot, ep in zip(slots, self.endpoints, strict=True):
            out[slot] = layout.endpoint(ep.ip, ep.port)
        return out

    def members(self) -> dict[bytes, bytes]:
        """Its ``members`` entries: one per endpoint when it has affinity."""
        if not self.affinity_timeout:
            return {}
        return {layout.member(self.addr, self.port, self.protocol, ep.ip, ep.port):
                layout.MEMBER_VALUE for ep in self.endpoints}  # fmt: skip

    @property
    def text(self) -> str:
        """One line of ``pyproxy render``: the address, the port it serves, the endpoints."""
        affinity = f" affinity {self.affinity_timeout}s" if self.affinity_timeout else ""
        eps = " ".join(ep.hostport for ep in self.endpoints)
        front = hostport(self.addr, self.port)
        return f"{front}/{self.protocol.value.lower()} {self.name}{affinity} -> {eps}"


def render_port(
    sp: ServicePort,
    eps: tuple[Endpoint, ...],
    node: NodeInfo,
    family: IPFamily,
    nodeport_ips: tuple[IPAddress, ...] = (),
    affinity: bool = False,
) -> list[Balanced]:
    """The addresses of one service port (a family view) balanced at the socket;
    ``nodeport_ips``: this node's addresses that serve NodePorts; ``affinity``: balance a
    port with ClientIP affinity too (``--bpf-socket-affinity``)."""
    cluster_ip = sp.cluster_ip(family)
    if cluster_ip is None or sp.protocol not in layout.PROTOCOLS:
        return []
    if sp.session_affinity_client_ip and not affinity:
        return []
    sel = categorize_endpoints(sp, eps, node)
    timeout = sp.sticky_max_age_seconds if sp.session_affinity_client_ip else 0

    def balanced(addr: IPAddress, to: tuple[Endpoint, ...], port: int = sp.port) -> Balanced:
        return Balanced(addr, port, sp.protocol, str(sp.name), to, timeout)

    out = [balanced(cluster_ip, sel.internal)] if sel.internal else []
    if sel.cluster:
        out += [balanced(ip, sel.cluster) for ip in sp.external_ips]
        if not sp.load_balancer_source_ranges:
            out += [balanced(ip, sel.cluster) for ip in sp.load_balancer_ips]
        if sp.node_port:
            out += [balanced(ip, sel.cluster, sp.node_port) for ip in nodeport_ips]
    return out
