"""BPF maps through the ``bpf()`` system call, with ctypes: the kernel port the ebpf mode
writes its services through.

No library: libbpf's map calls are thin wrappers of the same syscall, and Debian's
python3 has no maintained binding for it (``../shared/reference/ebpf.md``, section 3).
Each call builds the command's part of ``union bpf_attr`` (include/uapi/linux/bpf.h) and
raises ``BpfError`` with the errno on refusal. A map is a file descriptor: pinned in a bpffs
it outlives the process, and the next one opens it again (``Map.open``).
"""

from __future__ import annotations

import ctypes
import enum
import errno
import functools
import os
import platform
from collections.abc import Iterable, Iterator
from typing import NamedTuple

# The bpf syscall's number per architecture (arch/*/include/uapi/asm/unistd*.h).
_NR_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class Cmd(enum.IntEnum):
    MAP_CREATE = 0
    MAP_LOOKUP_ELEM = 1
    MAP_UPDATE_ELEM = 2
    MAP_DELETE_ELEM = 3
    MAP_GET_NEXT_KEY = 4
    OBJ_PIN = 6
    OBJ_GET = 7
    OBJ_GET_INFO_BY_FD = 15
    PROG_QUERY = 16
    MAP_UPDATE_BATCH = 26


class MapType(enum.IntEnum):
    HASH = 1
    ARRAY = 2
    PERCPU_HASH = 5
    LRU_HASH = 9
    LRU_PERCPU_HASH = 10


class Update(enum.IntEnum):
    """How an update treats an existing key."""

    ANY = 0
    NOEXIST = 1
    EXIST = 2


NO_PREALLOC = 1
"""``BPF_F_NO_PREALLOC``: a hash map's entries are allocated as they are added."""


class BpfError(OSError):
    """The kernel refused a bpf() command: ``errno`` says why."""


class _MapCreate(ctypes.Structure):
    _fields_ = [
        ("map_type", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("numa_node", ctypes.c_uint32),
        ("map_name", ctypes.c_char * 16),
    ]


class _Elem(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),  # next_key for MAP_GET_NEXT_KEY
        ("flags", ctypes.c_uint64),
    ]


class _Batch(ctypes.Structure):
    _fields_ = [
        ("in_batch", ctypes.c_uint64),
        ("out_batch", ctypes.c_uint64),
        ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _Obj(ctypes.Structure):
    _fields_ = [
        ("pathname", ctypes.c_uint64),
        ("bpf_fd", ctypes.c_uint32),
        ("file_flags", ctypes.c_uint32),
    ]


class _Info(ctypes.Structure):
    _fields_ = [
        ("bpf_fd", ctypes.c_uint32),
        ("info_len", ctypes.c_uint32),
        ("info", ctypes.c_uint64),
    ]


class _MapInfo(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
    ]


def bpf(cmd: Cmd, attr: ctypes.Structure) -> int:
    """One bpf() call; its non-negative result, or ``BpfError``."""
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise BpfError(errno.ENOSYS, f"bpf(): no syscall number known for {platform.machine()}")
    ret = int(_libc.syscall(nr, int(cmd), ctypes.byref(attr), ctypes.sizeof(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"bpf({cmd.name}): {os.strerror(err)}")
    return ret


def _addr(buf: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.addressof(buf)


class Map:
    """One BPF map, by its file descriptor. Keys and values are bytes of the map's sizes."""

    def __init__(self, fd: int, key_size: int, value_size: int, max_entries: int) -> None:
        self.fd = fd
        self.key_size = key_size
        self.value_size = value_size
        self.max_entries = max_entries

    @classmethod
    def create(
        cls, kind: MapType, key_size: int, value_size: int, max_entries: int, name: str = "",
        flags: int = 0,
    ) -> Map:  # fmt: skip
        attr = _MapCreate(kind, key_size, value_size, max_entries, flags, 0, 0,
                          name.encode()[:15])  # fmt: skip
        return cls(bpf(Cmd.MAP_CREATE, attr), key_size, value_size, max_entries)

    @classmethod
    def open(cls, path: str) -> Map:
        """A map pinned at ``path`` (in a bpffs), with its sizes as the kernel has them."""
        name = ctypes.create_string_buffer(os.fsencode(path))
        fd = bpf(Cmd.OBJ_GET, _Obj(_addr(name), 0, 0))
        try:
            info = map_info(fd)
        except BpfError:
            os.close(fd)
            raise
        return cls(fd, info.key_size, info.value_size, info.max_entries)

    def pin(self, path: str) -> None:
        name = ctypes.create_string_buffer(os.fsencode(path))
        bpf(Cmd.OBJ_PIN, _Obj(_addr(name), self.fd, 0))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Map:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _key(self, key: bytes) -> ctypes.Array[ctypes.c_char]:
        if len(key) != self.key_size:
            raise ValueError(f"key of {len(key)} bytes for a map of {self.key_size}-byte keys")
        return ctypes.create_string_buffer(key, self.key_size)

    def update(self, key: bytes, value: bytes, how: Update = Update.ANY) -> None:
        if len(value) != self.value_size:
            raise ValueError(
                f"value of {len(value)} bytes for a map of {self.value_size}-byte values"
            )
        k, v = self._key(key), ctypes.create_string_buffer(value, self.value_size)
        bpf(Cmd.MAP_UPDATE_ELEM, _Elem(self.fd, 0, _addr(k), _addr(v), how))

    def _lookup(self, key: bytes, size: int) -> bytes | None:
        k, v = self._key(key), ctypes.create_string_buffer(size)
        try:
            bpf(Cmd.MAP_LOOKUP_ELEM, _Elem(self.fd, 0, _addr(k), _addr(v), 0))
        except BpfError as err:
            if err.errno == errno.ENOENT:
                return None
            raise
        return v.raw

    def lookup(self, key: bytes) -> bytes | None:
        return self._lookup(key, self.value_size)

    def lookup_percpu(self, key: bytes) -> list[bytes] | None:
        """A per-CPU map's values for ``key``, one per possible CPU (the kernel copies each,
        padded to 8 bytes)."""
        stride = (self.value_size + 7) // 8 * 8
        cpus = possible_cpus()
        raw = self._lookup(key, stride * cpus)
        if raw is None:
            return None
        return [raw[i * stride : i * stride + self.value_size] for i in range(cpus)]

    def delete(self, key: bytes) -> bool:
        """Remove ``key``; False when it was not there."""
        k = self._key(key)  # held: the kernel reads it during the call
        try:
            bpf(Cmd.MAP_DELETE_ELEM, _Elem(self.fd, 0, _addr(k), 0, 0))
        except BpfError as err:
            if err.errno == errno.ENOENT:
                return False
            raise
        return True

    def update_batch(self, items: Iterable[tuple[bytes, bytes]], how: Update = Update.ANY) -> int:
        """Many entries in one call (``BPF_MAP_UPDATE_BATCH``: about 0.5 us an entry here,
        against 4 us for one call each). Returns how many were written."""
        pairs = list(items)
        if not pairs:
            return 0
        for k, v in pairs:
            if len(k) != self.key_size or len(v) != self.value_size:
                raise ValueError(f"entry of {len(k)}/{len(v)} bytes for a map of "
                                 f"{self.key_size}/{self.value_size}-byte keys/values")  # fmt: skip
        keys = ctypes.create_string_buffer(b"".join(k for k, _ in pairs))
        values = ctypes.create_string_buffer(b"".join(v for _, v in pairs))
        attr = _Batch(0, 0, _addr(keys), _addr(values), len(pairs), self.fd, how, 0)
        try:
            bpf(Cmd.MAP_UPDATE_BATCH, attr)
        except BpfError as err:
            raise BpfError(err.errno, f"{err.strerror} after {attr.count} of {len(pairs)} "
                                      "entries") from None  # fmt: skip
        return int(attr.count)

    def keys(self) -> Iterator[bytes]:
        """Every key, in the kernel's order. A key deleted meanwhile restarts the walk at the
        map's first key (the kernel's rule for a missing key), so callers collect first."""
        prev: ctypes.Array[ctypes.c_char] | None = None
        nxt = ctypes.create_string_buffer(self.key_size)
        while True:
            attr = _Elem(self.fd, 0, _addr(prev) if prev is not None else 0, _addr(nxt), 0)
            try:
                bpf(Cmd.MAP_GET_NEXT_KEY, attr)
            except BpfError as err:
                if err.errno == errno.ENOENT:
                    return
                raise
            yield nxt.raw
            prev = ctypes.create_string_buffer(nxt.raw, self.key_size)

    def items(self) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:
                out[key] = value
        return out


class AttachType(enum.IntEnum):
    """The cgroup hooks the socket programs use (enum bpf_attach_type)."""

    CONNECT4 = 10
    CONNECT6 = 11
    SENDMSG4 = 14
    SENDMSG6 = 15
    RECVMSG4 = 19
    RECVMSG6 = 20
    GETPEERNAME4 = 29
    GETPEERNAME6 = 30


class _Query(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("prog_cnt", ctypes.c_uint32),
    ]


def attached(cgroup: str, hook: AttachType) -> list[int]:
    """The ids of the programs attached to ``cgroup`` itself at ``hook`` (not inherited)."""
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ids = (ctypes.c_uint32 * 64)()
        q = _Query(fd, hook, 0, 0, ctypes.addressof(ids), 64)
        bpf(Cmd.PROG_QUERY, q)
        return list(ids[: q.prog_cnt])
    finally:
        os.close(fd)


@functools.cache
def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """How many values a per-CPU map holds for a key: the possible CPUs (``0-3``, ``0,2-5``).
    Read once: they do not change while the machine runs, and a scrape reads every
    service's counts."""
    with open(path) as f:
        text = f.read().strip()
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


class MapInfo(NamedTuple):
    kind: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    name: str


def map_info(fd: int) -> MapInfo:
    """What the kernel knows of the map behind ``fd`` (a pinned map's sizes, its id)."""
    info = _MapInfo()
    bpf(Cmd.OBJ_GET_INFO_BY_FD, _Info(fd, ctypes.sizeof(info), ctypes.addressof(info)))
    return MapInfo(info.type, info.id, info.key_size, info.value_size, info.max_entries,
                   info.map_flags, info.name.decode())  # fmt: skip
