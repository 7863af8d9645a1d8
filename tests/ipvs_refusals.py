"""IPVS and ipset calls the kernel refuses, and near ones it takes, after a common set-up: the
unit suite holds ``pyproxy.kernel.ipvs_fake.FakeIpvsKernel`` to them, and the user-mode Linux
guest (``tests/ipvs_guest/test_ipvs_refusals.py``) holds the kernel's real IPVS to the same
list through ``pyproxy.kernel.ipvs.IpvsKernel``. A refusal is an ``IpvsError``: anything else
escaping the port would bypass the engine's fallback to a full sync."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from pyproxy.kernel.ipvs import IpSets, Ipvs, IpvsError, Service

VS = (6, "10.255.0.1", 80)
OTHER = (6, "10.255.0.2", 80)
DEST = ("10.255.1.1", 8080)
NEW_DEST = ("10.255.1.2", 8080)
RR = Service("rr")
SETS = {"PYPROXY-T-IPPORT": "hash:ip,port", "PYPROXY-T-PORT": "bitmap:port",
        "PYPROXY-T6-IP": "hash:ip"}  # fmt: skip
FAMILIES = {"PYPROXY-T6-IP": socket.AF_INET6}

Op = Callable[[Ipvs, IpSets], None]


def setup(ipvs: Ipvs, sets: IpSets) -> None:
    ipvs.add_service(VS, RR)
    ipvs.set_dest(VS, DEST, 1, new=True)
    for name, stype in SETS.items():
        sets.ensure(name, stype, FAMILIES.get(name, socket.AF_INET))
    sets.add("PYPROXY-T-IPPORT", SETS["PYPROXY-T-IPPORT"], ("10.255.0.1", "tcp:80"))


def teardown(ipvs: Ipvs, sets: IpSets) -> None:
    """Remove what the set-up and the cases made (also after a failure)."""
    for key in (VS, OTHER):
        if key in ipvs.services():
            ipvs.delete_service(key)
    for name in SETS:
        sets.destroy(name)


def check(ipvs: Ipvs, sets: IpSets, op: Op, refused: bool) -> None:
    """After the set-up: ``op`` raises IpvsError when ``refused``, and is taken otherwise."""
    setup(ipvs, sets)
    if refused:
        with pytest.raises(IpvsError):
            op(ipvs, sets)
    else:
        op(ipvs, sets)


def _ipport(entry: tuple[str | int, ...]) -> Op:
    return lambda v, s: s.add("PYPROXY-T-IPPORT", SETS["PYPROXY-T-IPPORT"], entry)


# (what, call, refused)
CASES: list[tuple[str, Op, bool]] = [
    ("adding a virtual server that exists", lambda v, s: v.add_service(VS, RR), True),
    ("adding a new virtual server", lambda v, s: v.add_service(OTHER, RR), False),
    ("an unknown scheduler", lambda v, s: v.add_service(OTHER, Service("no-such")), True),
    ("changing a missing virtual server", lambda v, s: v.update_service(OTHER, RR), True),
    ("changing a virtual server's persistence",
     lambda v, s: v.update_service(VS, Service("rr", 60)), False),
    ("deleting a missing virtual server", lambda v, s: v.delete_service(OTHER), True),
    ("deleting a virtual server with real servers", lambda v, s: v.delete_service(VS), False),
    ("adding a real server that exists", lambda v, s: v.set_dest(VS, DEST, 1, True), True),
    ("adding a new real server", lambda v, s: v.set_dest(VS, NEW_DEST, 1, True), False),
    ("changing a missing real server's weight",
     lambda v, s: v.set_dest(VS, NEW_DEST, 0, False), True),
    ("changing a real server's weight", lambda v, s: v.set_dest(VS, DEST, 0, False), False),
    ("a real server of a missing virtual server",
     lambda v, s: v.set_dest(OTHER, DEST, 1, True), True),
    ("deleting a missing real server", lambda v, s: v.delete_dest(VS, NEW_DEST), True),
    ("deleting a real server", lambda v, s: v.delete_dest(VS, DEST), False),
    ("an ipset member that fits", _ipport(("10.255.0.2", "udp:53")), False),
    ("an ipset member with a part missing", _ipport(("10.255.0.2",)), True),
    ("an ipset member of the other family", _ipport(("fd00::1", "tcp:80")), True),
    ("an IPv6 member of an IPv6 set",
     lambda v, s: s.add("PYPROXY-T6-IP", "hash:ip", ("fd00::1",)), False),
    ("an IPv4 member of an IPv6 set",
     lambda v, s: s.add("PYPROXY-T6-IP", "hash:ip", ("10.255.0.1",)), True),
    ("a member of a missing set",
     lambda v, s: s.add("PYPROXY-T-ABSENT", "hash:ip", ("10.255.0.1",)), True),
    ("a port in a bitmap:port set",
     lambda v, s: s.add("PYPROXY-T-PORT", "bitmap:port", (30080,)), False),
]  # fmt: skip
