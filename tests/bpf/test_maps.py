"""The BPF map port against this kernel: what it writes the kernel holds, what the kernel
refuses comes back as ``BpfError`` with its errno, a batch writes as many entries as one call
each, and a map pinned in a bpffs of the test's own is opened again with its sizes. Maps are
not attached to anything: nothing here touches the machine's network. The bpffs is mounted in
a temporary directory and unmounted afterwards, also when a test fails."""

from __future__ import annotations

import errno
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyproxy.kernel.bpf import NO_PREALLOC, BpfError, Map, MapType, Update, map_info

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="BPF maps need root")


def key(n: int) -> bytes:
    """A 12-byte key shaped like a service's: address, port, protocol, slot."""
    return struct.pack("!IHBxI", 0x0A600000 + n, 80, 6, 0)


@pytest.fixture
def hash_map() -> Iterator[Map]:
    with Map.create(MapType.HASH, 12, 8, 1000, "pyk_test", NO_PREALLOC) as m:
        yield m


def test_an_entry_written_is_read_back_and_deleted(hash_map: Map) -> None:
    hash_map.update(key(1), b"\x01" * 8)
    assert hash_map.lookup(key(1)) == b"\x01" * 8
    assert hash_map.lookup(key(2)) is None
    assert hash_map.delete(key(1)) is True
    assert hash_map.delete(key(1)) is False
    assert hash_map.items() == {}


def test_the_kernels_refusals_carry_their_errno(hash_map: Map) -> None:
    hash_map.update(key(1), bytes(8))
    with pytest.raises(BpfError) as exists:
        hash_map.update(key(1), bytes(8), Update.NOEXIST)
    assert exists.value.errno == errno.EEXIST
    with pytest.raises(BpfError) as missing:
        hash_map.update(key(2), bytes(8), Update.EXIST)
    assert missing.value.errno == errno.ENOENT
    with pytest.raises(ValueError):
        hash_map.update(b"short", bytes(8))


def test_a_full_map_refuses_one_more_entry() -> None:
    with Map.create(MapType.HASH, 12, 8, 4) as m:
        m.update_batch((key(i), bytes(8)) for i in range(4))
        with pytest.raises(BpfError) as full:
            m.update(key(4), bytes(8))
        assert full.value.errno == errno.E2BIG
        assert len(m.items()) == 4


def test_a_batch_writes_every_entry(hash_map: Map) -> None:
    entries = {key(i): struct.pack("=Q", i) for i in range(1000)}
    assert hash_map.update_batch(entries.items()) == 1000
    assert hash_map.items() == entries
    assert sorted(hash_map.keys()) == sorted(entries)


@pytest.fixture
def bpffs(tmp_path: Path) -> Iterator[Path]:
    """A bpffs of the test's own (this machine mounts none at /sys/fs/bpf)."""
    where = tmp_path / "bpffs"
    where.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_pinned_map_outlives_its_descriptor(bpffs: Path) -> None:
    with Map.create(MapType.LRU_HASH, 12, 8, 64, "pyk_pinned") as m:
        m.update(key(7), b"\x07" * 8)
        m.pin(str(bpffs / "services"))
        created = map_info(m.fd)
    with Map.open(str(bpffs / "services")) as again:
        info = map_info(again.fd)
        assert (info.id, info.kind, info.name) == (created.id, MapType.LRU_HASH, "pyk_pinned")
        assert (again.key_size, again.value_size, again.max_entries) == (12, 8, 64)
        assert again.items() == {key(7): b"\x07" * 8}
    with pytest.raises(BpfError) as gone:
        Map.open(str(bpffs / "nothing"))
    assert gone.value.errno == errno.ENOENT
