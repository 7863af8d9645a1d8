"""IPVS virtual servers, ipsets and the dummy interface, through pyroute2's netlink.

Plain values in, plain values out: a virtual server is keyed by (protocol number, address,
port); nothing here knows a Service. Both families: for IPv6, pyroute2 0.9 types the service
netmask as an IPv4 address while the kernel reads its 4 raw bytes as a host-order prefix
length, so ``netmask="128.0.0.0"`` is what encodes /128.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import subprocess
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyroute2 import IPVS, IPRoute, IPSet, IPVSDest, IPVSService
from pyroute2.ipset import PortEntry
from pyroute2.netlink.exceptions import NetlinkError

from pyproxy.kernel.addresses import Address, local_addresses

log = logging.getLogger(__name__)

MASQ = 0  # IP_VS_CONN_F_MASQ; pyroute2's default (3) would be direct routing
F_PERSISTENT = 0x1
VSKey = tuple[int, str, int]  # (protocol number, address, port)
DestKey = tuple[str, int]


class IpvsError(RuntimeError):
    pass


@dataclass(frozen=True)
class Stats:
    """What the kernel counted for a virtual or real server since it was created."""

    connections: int = 0
    packets_in: int = 0
    packets_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


def _stats(msg: Any, nla: str, prefix: str) -> Stats:
    """The 64-bit statistics of a dumped service or dest (pyroute2's from_message drops
    them, so they are read from the message itself)."""
    attrs = dict(msg.get(nla)["attrs"])
    raw = attrs.get(f"{prefix}STATS64") or attrs.get(f"{prefix}STATS")
    vals = dict(raw["attrs"]) if raw is not None else {}

    def get(name: str) -> int:
        return int(vals.get(f"IPVS_STATS_ATTR_{name}", 0) or 0)

    return Stats(get("CONNS"), get("INPKTS"), get("OUTPKTS"), get("INBYTES"), get("OUTBYTES"))


@dataclass(frozen=True)
class Service:
    scheduler: str
    timeout: int = 0  # persistence seconds; 0 = none

    @property
    def flags(self) -> int:
        return F_PERSISTENT if self.timeout else 0


@dataclass(frozen=True)
class Dest:
    weight: int
    active: int = 0
    inactive: int = 0


BITMAP_PORTS = (0, 65535)
"""The range of a bitmap:port set (NodePorts): every port."""


def ipset_create_argv(name: str, stype: str, ipv6: bool) -> list[str]:
    """The ``ipset create`` command for a set as IpSets.ensure makes it (pyproxy diff loads
    one in a scratch namespace)."""
    if stype == "bitmap:port":
        return ["ipset", "create", name, stype, "range", "{}-{}".format(*BITMAP_PORTS)]
    return ["ipset", "create", name, stype, "family", "inet6" if ipv6 else "inet"]


def socket_family(ipv6: bool) -> int:
    return socket.AF_INET6 if ipv6 else socket.AF_INET


def family(addr: str) -> int:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def _svc(key: VSKey, spec: Service | None = None) -> IPVSService:
    proto, addr, port = key
    kw: dict[str, object] = {"addr": addr, "port": port, "protocol": proto}
    if family(addr) == socket.AF_INET6:
        kw.update(af=socket.AF_INET6, netmask="128.0.0.0")
    if spec is not None:
        kw.update(
            sched_name=spec.scheduler,
            timeout=spec.timeout,
            flags={"flags": spec.flags, "mask": 0xFFFF},
        )
    return IPVSService(**kw)


class Ipvs:
    def __init__(self) -> None:
        try:
            self.sock = IPVS()
        except (NetlinkError, OSError) as err:
            raise IpvsError(f"IPVS is not available in this kernel: {err}") from None

    def close(self) -> None:
        self.sock.close()

    def services(self) -> dict[VSKey, Service]:
        out: dict[VSKey, Service] = {}
        for msg in self.sock.service("dump"):
            s = IPVSService.from_message(msg)
            if s.get("fwmark"):
                continue
            key = (int(s["protocol"]), str(s["addr"]), int(s["port"]))
            # pyroute2's from_message keeps its default "timeout" (0) and puts the kernel's
            # value under the attribute's own name (found by pyproxy diff: every full sync
            # re-issued an update for each persistent service).
            timeout = s.get("IPVS_SVC_ATTR_TIMEOUT", s.get("timeout", 0))
            out[key] = Service(str(s.get("sched_name", "")), int(timeout or 0))
        return out

    def statistics(self) -> dict[VSKey, tuple[Stats, dict[DestKey, Stats]]]:
        """Every virtual server's counters, with its real servers' (``pyproxy status``)."""
        out: dict[VSKey, tuple[Stats, dict[DestKey, Stats]]] = {}
        try:
            for msg in self.sock.service("dump"):
                s = IPVSService.from_message(msg)
                if s.get("fwmark"):
                    continue
                key = (int(s["protocol"]), str(s["addr"]), int(s["port"]))
                dests = {}
                for dm in self.sock.dest("dump", service=_svc(key)):
                    d = IPVSDest.from_message(dm)
                    dests[(str(d["addr"]), int(d["port"]))] = _stats(
                        dm, "IPVS_CMD_ATTR_DEST", "IPVS_DEST_ATTR_"
                    )
                out[key] = (_stats(msg, "IPVS_CMD_ATTR_SERVICE", "IPVS_SVC_ATTR_"), dests)
        except NetlinkError as err:
            raise IpvsError(f"read IPVS statistics: {err}") from None
        return out

    def dests(self, key: VSKey) -> dict[DestKey, Dest]:
        out: dict[DestKey, Dest] = {}
        try:
            msgs = list(self.sock.dest("dump", service=_svc(key)))
        except NetlinkError as err:
            raise IpvsError(f"list real servers of {key}: {err}") from None
        for msg in msgs:
            d = IPVSDest.from_message(msg)
            out[(str(d["addr"]), int(d["port"]))] = Dest(
                int(d.get("weight", 0)),
                int(d.get("IPVS_DEST_ATTR_ACTIVE_CONNS", 0)),
                int(d.get("IPVS_DEST_ATTR_INACT_CONNS", 0)),
            )
        return out

    def _do(self, what: str, fn: object, *args: object, **kw: object) -> None:
        try:
            fn(*args, **kw)  # type: ignore[operator]
        except NetlinkError as err:
            if err.code == errno.ENOENT and "sched" in what:
                raise IpvsError(f"{what}: scheduler not available in this kernel") from None
            raise IpvsError(f"{what}: {err}") from None

    def add_service(self, key: VSKey, spec: Service) -> None:
        self._do(
            f"add virtual server {key} sched {spec.scheduler}",
            self.sock.service,
            "add",
            service=_svc(key, spec),
        )

    def update_service(self, key: VSKey, spec: Service) -> None:
        self._do(f"update virtual server {key}", self.sock.service, "set", service=_svc(key, spec))

    def delete_service(self, key: VSKey) -> None:
        self._do(f"delete virtual server {key}", self.sock.service, "del", service=_svc(key))

    def set_dest(self, key: VSKey, dest: DestKey, weight: int, new: bool) -> None:
        d = IPVSDest(addr=dest[0], port=dest[1], weight=weight, fwd_method=MASQ)
        self._do(
            f"{'add' if new else 'update'} real server {dest} of {key}",
            self.sock.dest,
            "add" if new else "set",
            service=_svc(key),
            dest=d,
        )

    def delete_dest(self, key: VSKey, dest: DestKey) -> None:
        d = IPVSDest(addr=dest[0], port=dest[1], fwd_method=MASQ)
        self._do(
            f"delete real server {dest} of {key}", self.sock.dest, "del", service=_svc(key), dest=d
        )


def scheduler_available(name: str) -> bool:
    """Load ip_vs_<name> the way the kernel would (its modprobe helper) and check it."""
    module = f"ip_vs_{name}"
    if Path(f"/sys/module/{module}").exists():
        return True
    helper = Path("/proc/sys/kernel/modprobe").read_text().strip() or "modprobe"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([helper, module], capture_output=True, timeout=20)
    return Path(f"/sys/module/{module}").exists()


# ---- ipsets -------------------------------------------------------------------------------

Entry = tuple[str | int, ...]
_PROTO = {"tcp": 6, "udp": 17, "sctp": 132}


def _to_pyroute2(stype: str, entry: Entry) -> tuple[object, str]:
    """Our entry tuples -> pyroute2's (entry, etype). Ports are 'proto:port' strings."""
    parts = stype.split(":", 1)[1].split(",")
    out: list[object] = []
    for kind, value in zip(parts, entry, strict=True):
        if kind == "port":
            if isinstance(value, int):
                out.append(PortEntry(value))
            else:
                proto, _, number = str(value).partition(":")
                out.append(PortEntry(int(number), protocol=_PROTO[proto]))
        else:
            out.append(str(value))
    return (out[0] if len(out) == 1 else tuple(out)), ",".join(parts)


def _entry_family(entry: Entry) -> int:
    return socket.AF_INET6 if isinstance(entry[0], str) and ":" in entry[0] else socket.AF_INET


class IpSets:
    def __init__(self) -> None:
        self.sock = IPSet()

    def close(self) -> None:
        self.sock.close()

    def names(self) -> set[str]:
        return {str(m.get_attr("IPSET_ATTR_SETNAME")) for m in self.sock.list()}

    def ensure(self, name: str, stype: str, family: int = socket.AF_INET) -> None:
        if name in self.names():
            return
        kw: dict[str, object] = {}
        if stype == "bitmap:port":
            kw["bitmap_ports_range"] = BITMAP_PORTS
        else:
            kw["family"] = family
        try:
            self.sock.create(name, stype=stype, **kw)
        except NetlinkError as err:
            raise IpvsError(f"create ipset {name} ({stype}): {err}") from None

    def members(self, name: str, stype: str) -> set[Entry]:
        parts = stype.split(":", 1)[1].split(",")
        out: set[Entry] = set()
        rev = {v: k for k, v in _PROTO.items()}
        for msg in self.sock.list(name):
            adt = msg.get_attr("IPSET_ATTR_ADT")
            if adt is None:
                continue
            for data in adt.get_attrs("IPSET_ATTR_DATA"):
                values: list[str | int] = []
                ips = [data.get_attr("IPSET_ATTR_IP_FROM"), data.get_attr("IPSET_ATTR_IP2")]
                for kind in parts:
                    if kind in ("ip", "net"):
                        ip = ips.pop(0)
                        addr = (
                            (
                                ip.get_attr("IPSET_ATTR_IPADDR_IPV4")
                                or ip.get_attr("IPSET_ATTR_IPADDR_IPV6")
                            )
                            if ip
                            else ""
                        )
                        if kind == "net":
                            cidr = data.get_attr(
                                "IPSET_ATTR_CIDR2" if not ips else "IPSET_ATTR_CIDR"
                            )
                            default = 128 if ":" in str(addr) else 32
                            addr = f"{addr}/{cidr if cidr is not None else default}"
                        values.append(str(addr))
                    elif kind == "port":
                        port = int(data.get_attr("IPSET_ATTR_PORT_FROM"))
                        proto = data.get_attr("IPSET_ATTR_PROTO")
                        values.append(f"{rev.get(proto, proto)}:{port}" if proto else port)
                out.add(tuple(values))
        return out

    def add(self, name: str, stype: str, entry: Entry) -> None:
        """A refused member is an IpvsError, as every other refusal of this port, so the
        engine falls back to a full sync instead of the error escaping the sync."""
        try:
            e, etype = _to_pyroute2(stype, entry)
            self.sock.add(name, e, etype=etype, exclusive=False, family=_entry_family(entry))
        except (NetlinkError, ValueError, KeyError) as err:
            raise IpvsError(f"add {entry} to ipset {name}: {err or type(err).__name__}") from None

    def delete(self, name: str, stype: str, entry: Entry) -> None:
        e, etype = _to_pyroute2(stype, entry)
        with contextlib.suppress(NetlinkError):
            self.sock.delete(name, e, etype=etype, family=_entry_family(entry))

    def destroy(self, name: str) -> bool:
        try:
            self.sock.destroy(name)
            return True
        except NetlinkError as err:
            log.info("ipset %s not destroyed: %s", name, err)
            return False


# ---- the dummy interface --------------------------------------------------------------------


def dummy_addresses(ifname: str) -> set[str] | None:
    """Addresses on ``ifname`` (both families, no link-local), or None without the link."""
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            return None
        addrs = {str(m.get_attr("IFA_ADDRESS")) for m in ipr.get_addr(index=idx[0])}
        return {a for a in addrs if not a.startswith("fe80:")}


def ensure_dummy(ifname: str) -> int:
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            try:
                ipr.link("add", ifname=ifname, kind="dummy")
            except NetlinkError as err:
                raise IpvsError(f"cannot create dummy interface {ifname}: {err}") from None
            idx = ipr.link_lookup(ifname=ifname)
        return int(idx[0])


def set_addresses(ifname: str, add: Iterable[str], remove: Iterable[str]) -> None:
    with IPRoute() as ipr:
        (idx,) = ipr.link_lookup(ifname=ifname)
        for addr in remove:
            with contextlib.suppress(NetlinkError):
                ipr.addr("del", index=idx, address=addr, prefixlen=128 if ":" in addr else 32)
        for addr in add:
            try:
                ipr.addr(
                    "add",
                    index=idx,
                    address=addr,
                    prefixlen=128 if ":" in addr else 32,
                    **({"flags": 0x02} if ":" in addr else {}),
                )  # IFA_F_NODAD
            except NetlinkError as err:
                if err.code != errno.EEXIST:
                    raise IpvsError(f"cannot add {addr} to {ifname}: {err}") from None


def delete_link(ifname: str) -> bool:
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            return False
        ipr.link("del", index=idx[0])
        return True


def statistics() -> dict[VSKey, tuple[Stats, dict[DestKey, Stats]]]:
    """Every virtual server's counters with its real servers', on a socket of its own (the
    readers, status and metrics, run beside the sync's)."""
    sock = Ipvs()
    try:
        return sock.statistics()
    finally:
        sock.close()


class IpvsKernel:
    """The IPVS mode's kernel port beyond xtables: IPVS and ipset netlink sockets, the dummy
    link's addresses and the host's own addresses. ``pyproxy.kernel.ipvs_fake`` stands in for
    it in unit tests, refusing what the kernel refuses."""

    def ipvs(self) -> Ipvs:
        return Ipvs()

    def ipsets(self) -> IpSets:
        return IpSets()

    def statistics(self) -> dict[VSKey, tuple[Stats, dict[DestKey, Stats]]]:
        return statistics()

    def scheduler_available(self, name: str) -> bool:
        return scheduler_available(name)

    def ensure_dummy(self, ifname: str) -> int:
        return ensure_dummy(ifname)

    def dummy_addresses(self, ifname: str) -> set[str] | None:
        return dummy_addresses(ifname)

    def set_addresses(self, ifname: str, add: Iterable[str], remove: Iterable[str]) -> None:
        set_addresses(ifname, add, remove)

    def delete_link(self, ifname: str) -> bool:
        return delete_link(ifname)

    def local_addresses(self, exclude_links: Collection[str] = ()) -> list[Address]:
        return local_addresses(exclude_links)
