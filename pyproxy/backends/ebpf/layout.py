"""The byte layout of the socket-balancing maps, as ``bpf/sock_lb.c`` declares it: the one
place Python knows it. Pure.

``services`` (hash): for each service address, port and protocol, slot 0 is the head (how
many endpoints, flags, the affinity timeout and the service port's id) and slots 1..n its
endpoints. ``members`` (hash): for a service with affinity, one key per endpoint, so that the
program knows in one lookup whether a remembered endpoint still is one. Addresses are 16
bytes, an IPv4 address IPv4-mapped (``::ffff:a.b.c.d``), so one map serves both families;
ports are in network order, as a socket's context holds them.
"""

from __future__ import annotations

import ipaddress
import struct
import sys

from pyproxy.model.types import IPAddress, Protocol

AFFINITY = 1
"""Head flag: a client keeps its endpoint for the timeout (ClientIP affinity)."""

PROTOCOLS = {Protocol.TCP: 6, Protocol.UDP: 17}
"""What the socket programs balance (SCTP is left to the rules)."""

KEY_SIZE = 24
VALUE_SIZE = 32
MEMBER_KEY_SIZE = 40
MEMBER_VALUE = b"\x01\0\0\0"
_KEY = struct.Struct("=16s2sBxI")  # addr, port (network order), protocol, pad, slot
_VALUE = struct.Struct("=16s2sHIII")  # addr, port, flags, count, timeout, id
_MEMBER = struct.Struct("=16s2sBx16s2sxx")  # service address, port, protocol; endpoint
_MAPPED = b"\0" * 10 + b"\xff\xff"  # ::ffff:0:0/96
_SLOT = 20  # the slot's offset in a key
_SLOT_OF = struct.Struct("=I")


def address(addr: IPAddress) -> bytes:
    """16 bytes: an IPv6 address as is, an IPv4 address IPv4-mapped."""
    if isinstance(addr, ipaddress.IPv4Address):
        return _MAPPED + addr.packed
    return addr.packed


def key(addr: IPAddress, port: int, protocol: Protocol, slot: int) -> bytes:
    return _KEY.pack(address(addr), port.to_bytes(2, "big"), PROTOCOLS[protocol], slot)


def keys(addr: IPAddress, port: int, protocol: Protocol, slots: int) -> list[bytes]:
    """The keys of slots 0..``slots``: one address conversion for them all (a full sync at
    10,000 services makes 110,000 keys)."""
    front = key(addr, port, protocol, 0)[:_SLOT]
    return [front + _SLOT_OF.pack(slot) for slot in range(slots + 1)]


def head(count: int, flags: int = 0, timeout: int = 0, ident: int = 0) -> bytes:
    return _VALUE.pack(bytes(16), bytes(2), flags, count, timeout, ident)


def member(addr: IPAddress, port: int, protocol: Protocol, ep: IPAddress, ep_port: int) -> bytes:
    """``members`` key: the endpoint is still one of the service's (affinity checks it)."""
    return _MEMBER.pack(address(addr), port.to_bytes(2, "big"), PROTOCOLS[protocol],
                        address(ep), ep_port.to_bytes(2, "big"))  # fmt: skip


def endpoint(addr: IPAddress, port: int) -> bytes:
    return _VALUE.pack(address(addr), port.to_bytes(2, "big"), 0, 0, 0, 0)


def count_key(ident: int) -> bytes:
    """``counts`` key: a service port's id (its head's), as the program reads it."""
    return _SLOT_OF.pack(ident)


def total(values: list[bytes]) -> int:
    """A ``counts`` entry's per-CPU values (u64 each), summed."""
    return sum(int.from_bytes(v, sys.byteorder) for v in values)


def is_mapped(key: bytes) -> bool:
    """Whether a key's address is an IPv4 one (IPv4-mapped)."""
    return key[:12] == _MAPPED


def slot_of(key: bytes) -> int:
    """0 for a service's head entry, 1..n for its endpoints."""
    return int(_KEY.unpack(key)[3])


def _addr_text(raw: bytes) -> str:
    addr = ipaddress.ip_address(raw[12:] if raw[:12] == _MAPPED else raw)
    return str(addr)


def describe(key: bytes, value: bytes) -> str:
    """One entry as a line (``pyproxy diff``): ``10.96.0.10:80/tcp slot 1: 10.244.1.2:8080``,
    ``... slot 0: 2 endpoints, affinity 10800s``."""
    addr, port, proto, slot = _KEY.unpack(key)
    name = {n: p for p, n in PROTOCOLS.items()}.get(proto)
    host = _addr_text(addr)
    front = f"[{host}]" if ":" in host else host
    head = f"{front}:{int.from_bytes(port, 'big')}/{name.value.lower() if name else proto}"
    ep, ep_port, flags, count, timeout, _ = _VALUE.unpack(value)
    if slot == 0:
        affinity = f", affinity {timeout}s" if flags & AFFINITY else ""
        return f"{head} slot 0: {count} endpoints{affinity}"
    host = _addr_text(ep)
    target = f"[{host}]" if ":" in host else host
    return f"{head} slot {slot}: {target}:{int.from_bytes(ep_port, 'big')}"


assert _KEY.size == KEY_SIZE and _VALUE.size == VALUE_SIZE and _MEMBER.size == MEMBER_KEY_SIZE
assert _KEY.size == _SLOT + _SLOT_OF.size
