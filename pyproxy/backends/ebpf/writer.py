"""One family's part of a sync in ebpf mode (the engine's FamilyWriter): the ``services``
map's entries for the family, written so that a reader never sees a service without its
endpoints. For each service, the endpoint slots first, then the head (which says how many
there are), then the slots and heads no longer wanted: an endpoint is never looked up in a
slot not yet written, and a service never disappears between two of its states. A partial
sync writes only the changed services' entries (all of each: a few); a full one writes every
entry and deletes the family's other keys (a previous process's, adopted from the pinned
map).

The map is reached only through ``ServicesMap`` (``kernel.bpf.Map`` on a kernel; a checking
fake in the unit tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from pyproxy.backends.base import BackendError
from pyproxy.backends.ebpf import layout
from pyproxy.backends.ebpf.table import SocketCache, SocketTable, Updates
from pyproxy.model.types import IPFamily


class ServicesMap(Protocol):
    def update_batch(self, items: Iterable[tuple[bytes, bytes]]) -> int: ...

    def delete(self, key: bytes) -> bool: ...

    def keys(self) -> Iterator[bytes]: ...


MapError = OSError
"""What the map port raises on a refusal (``kernel.bpf.BpfError`` is one)."""


def _is_head(key: bytes) -> bool:
    return layout.slot_of(key) == 0


def _family_of(key: bytes) -> IPFamily:
    return IPFamily.IPV4 if layout.is_mapped(key) else IPFamily.IPV6


class SocketFamily:
    def __init__(self, family: IPFamily, services: ServicesMap) -> None:
        self.family = family
        self.cache = SocketCache(family)
        self._map = services
        self.written = 0
        """Entries written so far (updates and deletions); tests count what a sync costs."""

    def before_partial(self, programmed: SocketTable, now: float) -> str:
        return ""

    def deferred_until(self) -> float | None:
        return None

    def write_full(self, new: SocketTable) -> None:
        want = new.entries_written()
        try:
            have = [k for k in self._map.keys() if _family_of(k) is self.family]  # noqa: SIM118
        except MapError as err:
            raise BackendError(f"cannot list the {self.family.value} socket map: {err}") from None
        self._write(want, [k for k in have if k not in want])

    def write_partial(self, programmed: SocketTable, updates: Updates) -> Callable[[], None]:
        want: dict[bytes, bytes] = {}
        old: dict[bytes, bytes] = {}
        for svc, entry in updates.items():
            before = programmed.entries.get(svc)
            if before is not None:
                old.update(before.objects.entries())
            if entry is not None:
                want.update(entry.objects.entries())
        # All of a changed service's entries, not only those that differ from the view: a
        # service's entries are few, and an entry lost meanwhile (deleted by hand) comes back
        # with the service's next change rather than at the next full sync.
        self._write(want, [k for k in old if k not in want])
        return lambda: None

    def _write(self, want: Mapping[bytes, bytes], gone: list[bytes]) -> None:
        slots = [(k, v) for k, v in want.items() if not _is_head(k)]
        heads = [(k, v) for k, v in want.items() if _is_head(k)]
        try:
            self._map.update_batch(slots)
            self._map.update_batch(heads)
            # heads of services gone first: nothing looks up their slots afterwards
            for key in sorted(gone, key=lambda k: not _is_head(k)):
                self._map.delete(key)
        except MapError as err:
            raise BackendError(f"{self.family.value} socket map write failed: {err}") from None
        self.written += len(want) + len(gone)
