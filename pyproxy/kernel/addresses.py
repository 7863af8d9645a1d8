"""This host's local addresses, through pyroute2's netlink (for --nodeport-addresses)."""

from __future__ import annotations

import ipaddress

from pyroute2 import IPRoute

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def local_addresses() -> list[Address]:
    out: list[Address] = []
    with IPRoute() as ipr:
        for msg in ipr.get_addr():
            value = msg.get_attr("IFA_ADDRESS")
            if value:
                out.append(ipaddress.ip_address(value.split("%")[0]))
    return sorted(set(out), key=lambda a: (a.version, a))
