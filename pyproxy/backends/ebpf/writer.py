"""One family's part of a sync in ebpf mode (the engine's FamilyWriter): the ``services``
map's entries for the family, written so that a reader never sees a service without its
endpoints. For each service, the endpoint slots first, then the head (which says how many
there are), then the slots and heads no longer wanted: an endpoint is never looked up in a
slot not yet written, and a service never disappears between two of its states. A partial
sync writes only the changed services' entries (all of each: a few); a full one writes every
entry and deletes the family's other keys (a previous process's, adopted from the pinned
map).

The maps are reached only through ``ServicesMap`` ports (``kernel.bpf.Map`` on a kernel; a
checking fake in the unit tests). An endpoint becomes a member (affinity may keep a client on
it) before its slot is written, and stops being one after its slot is gone."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple, Protocol

from pyproxy.backends.base import BackendError
from pyproxy.backends.ebpf import layout
from pyproxy.backends.ebpf.table import SocketCache, SocketTable, Updates
from pyproxy.config.settings import ProxyConfig
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


class SocketMaps(NamedTuple):
    services: ServicesMap
    members: ServicesMap
    """For services with affinity: which endpoints are still the service's."""


class SocketFamily:
    def __init__(self, family: IPFamily, maps: SocketMaps, cfg: ProxyConfig) -> None:
        self.family = family
        self.cache = SocketCache(family, cfg)
        self._maps = maps
        self.written = 0
        """Entries written so far (updates and deletions); tests count what a sync costs."""

    def before_partial(self, programmed: SocketTable, now: float) -> str:
        return ""

    def deferred_until(self) -> float | None:
        return None

    def _listed(self, m: ServicesMap, what: str) -> list[bytes]:
        try:
            return [k for k in m.keys() if _family_of(k) is self.family]  # noqa: SIM118
        except MapError as err:
            raise BackendError(f"cannot list the {self.family.value} {what} map: {err}") from None

    def write_full(self, new: SocketTable) -> None:
        want, members = new.entries_written(), new.members_written()
        stale = [k for k in self._listed(self._maps.services, "socket") if k not in want]
        gone = [k for k in self._listed(self._maps.members, "members") if k not in members]
        self._write(want, stale, members, gone)

    def write_partial(self, programmed: SocketTable, updates: Updates) -> Callable[[], None]:
        want: dict[bytes, bytes] = {}
        old: dict[bytes, bytes] = {}
        members: dict[bytes, bytes] = {}
        old_members: dict[bytes, bytes] = {}
        for svc, entry in updates.items():
            before = programmed.entries.get(svc)
            if before is not None:
                old.update(before.objects.entries())
                old_members.update(before.objects.members())
            if entry is not None:
                want.update(entry.objects.entries())
                members.update(entry.objects.members())
        # All of a changed service's entries, not only those that differ from the view: a
        # service's entries are few, and an entry lost meanwhile (deleted by hand) comes back
        # with the service's next change rather than at the next full sync.
        self._write(want, [k for k in old if k not in want], members,
                    [k for k in old_members if k not in members])  # fmt: skip
        return lambda: None

    def _write(self, want: Mapping[bytes, bytes], gone: list[bytes],
               members: Mapping[bytes, bytes], gone_members: list[bytes]) -> None:  # fmt: skip
        slots = [(k, v) for k, v in want.items() if not _is_head(k)]
        heads = [(k, v) for k, v in want.items() if _is_head(k)]
        try:
            self._maps.members.update_batch(members.items())
            self._maps.services.update_batch(slots)
            self._maps.services.update_batch(heads)
            # heads of services gone first: nothing looks up their slots afterwards
            for key in sorted(gone, key=lambda k: not _is_head(k)):
                self._maps.services.delete(key)
            for key in gone_members:
                self._maps.members.delete(key)
        except MapError as err:
            raise BackendError(f"{self.family.value} socket map write failed: {err}") from None
        self.written += len(want) + len(gone) + len(members) + len(gone_members)
