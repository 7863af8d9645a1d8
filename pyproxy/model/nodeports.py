"""Which node addresses accept NodePort traffic (``--nodeport-addresses``), decided once for
every backend from the node's facts.

Upstream takes CIDRs or the single word ``primary`` (the node's IP of each family from its
Node object); unset means every local address. pyproxy also accepts ``all`` (the same as
unset) and ``localhost`` (127.0.0.1 and ::1, alone or beside the others).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pyproxy.model.types import IPAddress, IPFamily, IPNetwork, NodeInfo

KEYWORDS = ("all", "primary", "localhost")
LOOPBACK = {
    IPFamily.IPV4: ipaddress.ip_address("127.0.0.1"),
    IPFamily.IPV6: ipaddress.ip_address("::1"),
}


@dataclass(frozen=True)
class NodePortAddresses:
    cidrs: tuple[IPNetwork, ...] = ()
    primary: bool = False
    localhost: bool = False

    @property
    def all(self) -> bool:
        """True when NodePorts are open on every local address of both families."""
        return not self.cidrs and not self.primary and not self.localhost

    @classmethod
    def parse(cls, items: list[str] | tuple[str, ...]) -> NodePortAddresses:
        """From flag or file values; raises ValueError naming the bad item."""
        words = [str(i).strip() for i in items if str(i).strip()]
        cidrs: list[IPNetwork] = []
        for w in words:
            if w in KEYWORDS:
                continue
            try:
                cidrs.append(ipaddress.ip_network(w, strict=False))
            except ValueError:
                raise ValueError(
                    f"{w!r} is neither a CIDR nor one of {', '.join(KEYWORDS)}"
                ) from None
        if "all" in words and len(words) > 1:
            raise ValueError("'all' cannot be combined with other values")
        if "primary" in words and cidrs:
            raise ValueError("can't use both 'primary' and CIDRs")
        return cls(tuple(cidrs), "primary" in words, "localhost" in words)

    @property
    def contains_ipv4_loopback(self) -> bool:
        """Whether 127.0.0.1 can be a NodePort address (upstream's ContainsIPv4Loopback)."""
        if self.all or self.localhost:
            return True
        start = ipaddress.ip_address("127.0.0.0")
        return any(
            c.version == 4 and (c.network_address.is_loopback or start in c) for c in self.cidrs
        )

    def explicit_loopback(self, family: IPFamily) -> bool:
        """Whether loopback of ``family`` was asked for by name: ``localhost`` or a loopback
        CIDR, never the zero CIDR (upstream v1.37's ContainsExplicitLoopback). nftables mode
        then serves TCP NodePorts on 127.0.0.1 / ::1 in user space (KEP-6032)."""
        return self.localhost or any(
            IPFamily.of(c) is family and c.network_address.is_loopback for c in self.cidrs
        )

    def __str__(self) -> str:
        words = [str(c) for c in self.cidrs]
        words += [w for w, on in (("primary", self.primary), ("localhost", self.localhost)) if on]
        return ",".join(words) or "all"

    @property
    def needs_local_addresses(self) -> bool:
        """Whether choosing the addresses needs this host's interface addresses."""
        return bool(self.cidrs) or self.primary

    def node_ips(self, node: NodeInfo, family: IPFamily) -> tuple[IPAddress, ...] | None:
        """The addresses of ``family`` that accept NodePorts, or None for "every local
        address" (a match on the kernel's LOCAL address type).

        As upstream (``primary`` becomes the primary IP's /32 or /128 at start, then
        GetNodeIPs), the CIDRs select among this host's interface addresses, so a primary IP
        that is not on an interface selects nothing; rendering offline, with no interface
        addresses known, they select among the Node object's. A family for which neither a
        CIDR nor a primary IP is known accepts NodePorts on every address."""
        if self.all:
            return None
        primary = node.primary_ip(family) if self.primary else None
        if primary is not None and primary.is_loopback:
            primary = None
        cidrs = [c for c in self.cidrs if IPFamily.of(c) is family]
        if not cidrs and primary is None and not self.localhost:
            return None
        known = node.local_addresses or node.addresses
        chosen: list[IPAddress] = [primary] if primary in known else []
        for cidr in cidrs:
            chosen += [ip for ip in known if ip.version == cidr.version and ip in cidr]
        if self.localhost:
            chosen.append(LOOPBACK[family])
        return tuple(dict.fromkeys(chosen))

    def listed_ips(self, node: NodeInfo, family: IPFamily) -> tuple[IPAddress, ...]:
        """The addresses of ``family`` a NodePort is served on by a mode that lists them
        (IPVS's virtual servers, ebpf's socket map) instead of matching the kernel's LOCAL
        type: the chosen ones, or for "all" every local address the kernel reported (the
        Node object's when rendering offline); never loopback or link-local."""
        chosen = self.node_ips(node, family)
        if chosen is None:
            chosen = node.local_addresses or node.addresses
        return tuple(
            ip
            for ip in chosen
            if IPFamily.of(ip) is family and not ip.is_loopback and not ip.is_link_local
        )
