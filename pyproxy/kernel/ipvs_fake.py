"""A checking stand-in for IPVS mode's kernel port (``IpvsKernel``), for unit tests: virtual
and real servers, ipsets and the dummy link's addresses in memory, refusing what the kernel
refuses (ip_vs_ctl.c, ip_set_core.c): adding a virtual server or a real server that exists
(EEXIST), changing or deleting one that does not (ESRCH, ENOENT), an unknown scheduler, an
ipset member for a set that does not exist, of the wrong shape for the set's type or of the
wrong address family, and addresses on a link that does not exist. This machine's kernel has
no IPVS, so the list these refusals are held to (``tests/ipvs_refusals.py``) is run against a
real IPVS in the user-mode Linux guest (``tests/ipvs_guest/test_ipvs_refusals.py``), which
also runs the whole mode.

Tests can set a real server's connection counts (``connections``) to drive draining.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from pyproxy.kernel.addresses import Address
from pyproxy.kernel.ipvs import (
    Dest,
    DestKey,
    Entry,
    IpSets,
    Ipvs,
    IpvsError,
    IpvsKernel,
    Service,
    Stats,
    VSKey,
)

SCHEDULERS = frozenset({"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"})


@dataclass
class _VirtualServer:
    spec: Service
    dests: dict[DestKey, int] = field(default_factory=dict)


@dataclass
class _Set:
    stype: str
    family: int
    members: set[Entry] = field(default_factory=set)


def _check_member(name: str, s: _Set, entry: Entry) -> None:
    parts = s.stype.split(":", 1)[1].split(",")
    if len(entry) != len(parts):
        raise IpvsError(f"ipset {name}: {entry} does not fit {s.stype}")
    for kind, value in zip(parts, entry, strict=True):
        if kind in ("ip", "net"):
            try:
                ip = ipaddress.ip_network(str(value)) if kind == "net" else ipaddress.ip_address(
                    str(value))  # fmt: skip
            except ValueError:
                raise IpvsError(f"ipset {name}: {value!r} is not an address") from None
            want = 6 if s.family == socket.AF_INET6 else 4
            if ip.version != want:
                raise IpvsError(f"ipset {name}: {value} is of the wrong family")
        elif kind == "port":
            number = value if isinstance(value, int) else str(value).partition(":")[2]
            if not str(number).isdigit() or not 0 <= int(number) <= 65535:
                raise IpvsError(f"ipset {name}: {value!r} is not a port")
            if s.stype.startswith("hash:") and isinstance(value, int):
                raise IpvsError(f"ipset {name}: {value!r} needs its protocol")


class FakeIpvs(Ipvs):
    def __init__(self, kernel: FakeIpvsKernel) -> None:
        self._k = kernel

    def close(self) -> None:
        pass

    def services(self) -> dict[VSKey, Service]:
        return {k: vs.spec for k, vs in self._k.virtual_servers.items()}

    def dests(self, key: VSKey) -> dict[DestKey, Dest]:
        vs = self._vs(key)
        return {d: Dest(w, *self._k.connections.get((key, d), (0, 0))) for d, w in vs.dests.items()}

    def statistics(self) -> dict[VSKey, tuple[Stats, dict[DestKey, Stats]]]:
        return {k: (self._k.stats.get(k, Stats()), {d: Stats() for d in vs.dests})
                for k, vs in self._k.virtual_servers.items()}  # fmt: skip

    def _vs(self, key: VSKey) -> _VirtualServer:
        vs = self._k.virtual_servers.get(key)
        if vs is None:
            raise IpvsError(f"virtual server {key}: No such process")
        return vs

    def add_service(self, key: VSKey, spec: Service) -> None:
        if key in self._k.virtual_servers:
            raise IpvsError(f"add virtual server {key}: File exists")
        if spec.scheduler not in SCHEDULERS:
            raise IpvsError(f"add virtual server {key}: scheduler not available in this kernel")
        self._k.virtual_servers[key] = _VirtualServer(spec)

    def update_service(self, key: VSKey, spec: Service) -> None:
        self._vs(key).spec = spec

    def delete_service(self, key: VSKey) -> None:
        self._vs(key)
        del self._k.virtual_servers[key]

    def set_dest(self, key: VSKey, dest: DestKey, weight: int, new: bool) -> None:
        vs = self._vs(key)
        if new and dest in vs.dests:
            raise IpvsError(f"add real server {dest} of {key}: File exists")
        if not new and dest not in vs.dests:
            raise IpvsError(f"update real server {dest} of {key}: No such file or directory")
        vs.dests[dest] = weight

    def delete_dest(self, key: VSKey, dest: DestKey) -> None:
        vs = self._vs(key)
        if dest not in vs.dests:
            raise IpvsError(f"delete real server {dest} of {key}: No such file or directory")
        del vs.dests[dest]


class FakeIpSets(IpSets):
    def __init__(self, kernel: FakeIpvsKernel) -> None:
        self._k = kernel

    def close(self) -> None:
        pass

    def names(self) -> set[str]:
        return set(self._k.sets)

    def ensure(self, name: str, stype: str, family: int = socket.AF_INET) -> None:
        self._k.sets.setdefault(name, _Set(stype, family))

    def _set(self, name: str) -> _Set:
        s = self._k.sets.get(name)
        if s is None:
            raise IpvsError(f"ipset {name}: The set with the given name does not exist")
        return s

    def members(self, name: str, stype: str) -> set[Entry]:
        return set(self._set(name).members)

    def add(self, name: str, stype: str, entry: Entry) -> None:
        s = self._set(name)
        _check_member(name, s, entry)
        s.members.add(entry)

    def delete(self, name: str, stype: str, entry: Entry) -> None:
        s = self._set(name)  # a missing member is ignored, as the port does
        s.members.discard(entry)

    def destroy(self, name: str) -> bool:
        return self._k.sets.pop(name, None) is not None


class FakeIpvsKernel(IpvsKernel):
    """IPVS, ipsets and a dummy link in memory (see the module)."""

    def __init__(self, local: Iterable[str] = ("172.31.0.10",)) -> None:
        self.virtual_servers: dict[VSKey, _VirtualServer] = {}
        self.sets: dict[str, _Set] = {}
        self.dummy: dict[str, set[str]] = {}
        self.local = [ipaddress.ip_address(a) for a in local]
        self.connections: dict[tuple[VSKey, DestKey], tuple[int, int]] = {}
        """(active, inactive) connections of a real server, as a test sets them."""
        self.stats: dict[VSKey, Stats] = {}
        """A virtual server's counters, as a test sets them."""

    def ipvs(self) -> Ipvs:
        return FakeIpvs(self)

    def ipsets(self) -> IpSets:
        return FakeIpSets(self)

    def statistics(self) -> dict[VSKey, tuple[Stats, dict[DestKey, Stats]]]:
        return FakeIpvs(self).statistics()

    def scheduler_available(self, name: str) -> bool:
        return name in SCHEDULERS

    def ensure_dummy(self, ifname: str) -> int:
        self.dummy.setdefault(ifname, set())
        return 1

    def dummy_addresses(self, ifname: str) -> set[str] | None:
        addrs = self.dummy.get(ifname)
        return set(addrs) if addrs is not None else None

    def set_addresses(self, ifname: str, add: Iterable[str], remove: Iterable[str]) -> None:
        addrs = self.dummy.get(ifname)
        if addrs is None:
            raise IpvsError(f"{ifname}: no such link")
        addrs.difference_update(remove)
        addrs.update(add)

    def delete_link(self, ifname: str) -> bool:
        return self.dummy.pop(ifname, None) is not None

    def local_addresses(self, exclude_links: Collection[str] = ()) -> list[Address]:
        return list(self.local)
