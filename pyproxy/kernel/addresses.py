"""This host's interface addresses, through netlink (for NodePort addresses).

IPVS mode asks for every address except kube-ipvs0's, which carries one per service. A plain
address dump returns them all (pyroute2's ``get_addr(index=...)`` filters in Python after
dumping everything: 0.2 s at 4,000 addresses here), so the per-link request is sent on a
socket with NETLINK_GET_STRICT_CHK, where the kernel filters by interface (0.2 ms); pyroute2
still encodes the request and decodes the replies. The dump of every address (nftables and
ebpf modes read it at each sync) goes through the same socket: pyroute2's ``IPRoute`` serves
its calls from a thread of its own, and beside a busy thread of the daemon each call then
waits on the interpreter's lock several times (64 ms median for one dump against 26 ms
through the plain socket, in one process with a thread spinning beside it; 1 ms each alone).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection, Iterator

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR
from pyroute2.netlink.rtnl import RTM_GETADDR
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
SOL_NETLINK = 270
NETLINK_GET_STRICT_CHK = 12


def local_addresses(exclude_links: Collection[str] = ()) -> list[Address]:
    """Every address on every interface, except those on the links named in
    ``exclude_links`` (IPVS mode's kube-ipvs0 carries service addresses, not node ones)."""
    skip: set[int] = set()
    if not exclude_links:
        values = list(_link_addresses(0))  # index 0: every link's
    else:
        with IPRoute() as ipr:
            skip = {i for name in exclude_links for i in ipr.link_lookup(ifname=name)}
            links = [link["index"] for link in ipr.get_links() if link["index"] not in skip]
        values = [v for index in links for v in _link_addresses(index)]
    out = {ipaddress.ip_address(v.split("%")[0]) for index, v in values if v and index not in skip}
    return sorted(out, key=lambda a: (a.version, a))


def _link_addresses(index: int) -> Iterator[tuple[int, str]]:
    """(interface index, address) of one link's addresses (index 0: every link's), filtered by
    the kernel (a kernel without strict checking answers with every link's: the caller
    filters again)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        s.bind((0, 0))
        req = ifaddrmsg()
        req["header"]["type"] = RTM_GETADDR
        req["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
        req["header"]["sequence_number"] = 1
        req["family"] = socket.AF_UNSPEC
        req["index"] = index
        req.encode()
        s.send(req.data)
        while True:
            data = s.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length = int.from_bytes(data[off : off + 4], "little")
                kind = int.from_bytes(data[off + 4 : off + 6], "little")
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    code = -int.from_bytes(data[off + 16 : off + 20], "little", signed=True)
                    raise OSError(code, f"netlink address dump: {code}")
                msg = ifaddrmsg(data[off : off + length])
                msg.decode()
                yield msg["index"], msg.get_attr("IFA_ADDRESS")
                off += (length + 3) & ~3
