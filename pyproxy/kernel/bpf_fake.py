"""A BPF hash map in memory, for unit tests: refuses what the kernel refuses (a key or value
of the wrong size, an entry beyond ``max_entries``: E2BIG, as ``tests/bpf/test_maps.py``
measures on this kernel) and counts the calls a sync makes."""

from __future__ import annotations

import errno
from collections.abc import Iterable, Iterator

from pyproxy.kernel.bpf import BpfError


class FakeMap:
    def __init__(self, key_size: int, value_size: int, max_entries: int) -> None:
        self.key_size = key_size
        self.value_size = value_size
        self.max_entries = max_entries
        self.entries: dict[bytes, bytes] = {}
        self.updates = 0
        self.deletes = 0
        self.log: list[tuple[str, bytes]] = []
        """("update" | "delete", key) in the order the kernel would see them."""

    def _check(self, key: bytes, value: bytes | None = None) -> None:
        if len(key) != self.key_size or (value is not None and len(value) != self.value_size):
            raise ValueError(f"entry of {len(key)}/{len(value or b'')} bytes for a map of "
                             f"{self.key_size}/{self.value_size}-byte keys/values")  # fmt: skip

    def update(self, key: bytes, value: bytes) -> None:
        self._check(key, value)
        if key not in self.entries and len(self.entries) >= self.max_entries:
            raise BpfError(errno.E2BIG, "bpf(MAP_UPDATE_ELEM): Argument list too long")
        self.entries[key] = value
        self.updates += 1
        self.log.append(("update", key))

    def update_batch(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        n = 0
        for key, value in items:
            self.update(key, value)
            n += 1
        return n

    def delete(self, key: bytes) -> bool:
        self._check(key)
        self.log.append(("delete", key))
        if self.entries.pop(key, None) is None:
            return False
        self.deletes += 1
        return True

    def keys(self) -> Iterator[bytes]:
        return iter(list(self.entries))
