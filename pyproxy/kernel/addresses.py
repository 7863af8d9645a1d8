"""This host's interface addresses, through pyroute2's netlink (for NodePort addresses)."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection

from pyroute2 import IPRoute

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def local_addresses(exclude_links: Collection[str] = ()) -> list[Address]:
    """Every address on every interface, except those on the links named in
    ``exclude_links`` (IPVS mode's kube-ipvs0 carries service addresses, not node ones)."""
    out: list[Address] = []
    with IPRoute() as ipr:
        skip = {i for name in exclude_links for i in ipr.link_lookup(ifname=name)}
        for msg in ipr.get_addr():
            value = msg.get_attr("IFA_ADDRESS")
            if value and msg["index"] not in skip:
                out.append(ipaddress.ip_address(value.split("%")[0]))
    return sorted(set(out), key=lambda a: (a.version, a))
