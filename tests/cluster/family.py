"""The real cluster's addresses in each IP family it can be brought up in: IPv4 (172.18.0.0/24
between the nodes), IPv6-only (unique local addresses, fd00:18::/64) and dual-stack (both, IPv4
primary, as kind's dual clusters are). Every address here lives only in the cluster's own
network namespaces (host.py); none is on the machine's own.

One ``Stack`` per family holds what the cluster needs of it: the lan's and the nodes'
addresses, a pod CIDR per node, the cluster CIDR, the Service range with the ``kubernetes``
Service's and the cluster DNS's addresses in it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

NODE_COUNT = 2


@dataclass(frozen=True)
class Stack:
    lan_prefix: str  # the lan's addresses, less the host part: "172.18.0." or "fd00:18::"
    lan_length: int
    pod_cidrs: tuple[str, ...]  # one per node, in node order
    cluster_cidr: str
    service_cidr: str
    kubernetes_ip: str  # the first address of the Service range: the API server's Service
    dns_ip: str
    # LoadBalancer addresses (MetalLB's pool) are on the lan, in ``lb_cidr``; the lan
    # namespace reaches them from ``client_ip``, an address outside the nodes' network, as a
    # client behind a router would (upstream's LoadBalancer tests take a client in the nodes'
    # /16 or /64 for one whose address the proxy did not keep).
    lb_range: tuple[str, str]
    lb_cidr: str
    client_ip: str

    @property
    def ipv6(self) -> bool:
        return ":" in self.lan_prefix

    @property
    def lan_ip(self) -> str:
        return self.lan_prefix + "1"

    def node_ip(self, i: int) -> str:
        return self.lan_prefix + str(i + 2)

    @property
    def host_length(self) -> int:
        return 128 if self.ipv6 else 32

    @property
    def default(self) -> str:
        return "::/0" if self.ipv6 else "0.0.0.0/0"


IPV4 = Stack(
    lan_prefix="172.18.0.",
    lan_length=24,
    pod_cidrs=("10.244.1.0/24", "10.244.2.0/24"),
    cluster_cidr="10.244.0.0/16",
    service_cidr="10.96.0.0/16",
    kubernetes_ip="10.96.0.1",
    dns_ip="10.96.0.10",
    lb_range=("172.18.0.200", "172.18.0.250"),
    lb_cidr="172.18.0.192/26",
    client_ip="172.19.0.1",
)
IPV6 = Stack(
    lan_prefix="fd00:18::",
    lan_length=64,
    pod_cidrs=("fd00:10:244:1::/64", "fd00:10:244:2::/64"),
    cluster_cidr="fd00:10:244::/56",
    service_cidr="fd00:10:96::/112",
    kubernetes_ip="fd00:10:96::1",
    dns_ip="fd00:10:96::a",
    lb_range=("fd00:18::200", "fd00:18::250"),
    lb_cidr="fd00:18::200/120",
    client_ip="fd00:19::1",
)
FAMILIES: dict[str, tuple[Stack, ...]] = {
    "ipv4": (IPV4,),
    "ipv6": (IPV6,),
    "dual": (IPV4, IPV6),
}


def stacks(family: str) -> tuple[Stack, ...]:
    """The family's stacks, the primary first."""
    if family not in FAMILIES:
        raise ValueError(f"unknown IP family {family!r} (one of {', '.join(FAMILIES)})")
    return FAMILIES[family]


def joined(family: str, field: str) -> str:
    """A field of each stack, comma-joined as the Kubernetes flags take dual-stack values."""
    return ",".join(str(getattr(s, field)) for s in stacks(family))


def url_host(ip: str) -> str:
    """An address as a URL's host: IPv6 in brackets."""
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip


def server(family: str) -> str:
    """The API server's URL on the lan's primary address."""
    return f"https://{url_host(stacks(family)[0].lan_ip)}:6443"
