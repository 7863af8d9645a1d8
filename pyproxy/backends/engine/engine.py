"""The per-family sync engine every mode runs on (iptables, nftables, IPVS, userspace).

One sync, for each IP family the mode programs: decide full or partial (and say why), render
what changed through the family's ``ServiceCache``, have the mode write it, and only once the
kernel accepted it record it as programmed; a partial write that fails falls back to a full
one in the same sync, and a failed full write leaves the family untrusted so the next sync is
full again. Then stale UDP conntrack entries of what changed are cleared. The engine also
gathers the timings, the no-local-endpoint counts and the mode's deferred work
(``sync_again_in``). Upstream writes this loop once per mode, and its metaproxier runs one
proxier per family; here it is written once for every mode.

A mode supplies a ``FamilyWriter`` per family: rendering (through its ``cache``),
and turning tables into its kernel's language and applying them (``write_full``,
``write_partial``). Kernel-free: the kernel is reached only through the writers and the
conntrack port passed in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pyproxy.backends.base import BackendError, SyncRequest, SyncResult
from pyproxy.backends.engine.cache import Entry, ServiceCache, ServiceTable
from pyproxy.backends.stale_conntrack import Filter, stale_filters
from pyproxy.model.types import IPFamily, NamespacedName, ProxyState

log = logging.getLogger(__name__)

T = TypeVar("T", bound=ServiceTable[Any])

DeleteConntrack = Callable[[Sequence[Filter], bool], int]
"""The conntrack port: delete the entries these filters match (True: IPv6); how many."""


class FamilyWriter(Protocol[T]):
    """What a mode supplies for one IP family."""

    @property
    def family(self) -> IPFamily: ...

    @property
    def cache(self) -> ServiceCache[Any, Any, T]:
        """Renders the family's tables (its ``renders`` count cache misses)."""
        ...

    def before_partial(self, programmed: T, now: float) -> str:
        """Deferred work due before a partial sync (nftables: deleting chains flushed a
        second ago); a reason for a full sync instead, or ""."""
        ...

    def write_full(self, new: T) -> None:
        """Make the kernel hold ``new``; BackendError if it did not take it."""
        ...

    def write_partial(
        self, programmed: T, updates: Mapping[NamespacedName, Entry[Any] | None]
    ) -> Callable[[], None]:
        """Write what moves the kernel from ``programmed`` to it plus ``updates`` (nothing
        when nothing differs); BackendError if the kernel refused. Must not change
        ``programmed`` or the writer's view of the kernel: returns what to record, which the
        engine calls once it has applied ``updates`` to ``programmed``."""
        ...

    def deferred_until(self) -> float | None:
        """Monotonic time of the writer's next deferred work (None: none)."""
        ...


@dataclass
class _Family(Generic[T]):
    writer: FamilyWriter[T]
    programmed: T | None = None
    """The last table written (also the render cache of the next full sync)."""
    trusted: bool = False
    """Whether the kernel holds ``programmed`` (False after a failed write)."""
    last_state: ProxyState | None = None


@dataclass
class _Times:
    render: float = 0.0
    apply: float = 0.0


class Engine(Generic[T]):
    def __init__(
        self,
        writers: Sequence[FamilyWriter[T]],
        delete_conntrack: DeleteConntrack,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.families = [_Family(w) for w in writers]
        self._delete_conntrack = delete_conntrack
        self._clock = clock

    def programmed(self, family: IPFamily) -> T | None:
        """What the kernel holds for ``family`` as far as pyproxy knows (None: nothing yet)."""
        for f in self.families:
            if f.writer.family is family:
                return f.programmed
        return None

    def trusted(self) -> list[tuple[FamilyWriter[T], T]]:
        """The families whose kernel state is what pyproxy wrote (for drift checks)."""
        return [(f.writer, f.programmed) for f in self.families
                if f.trusted and f.programmed is not None]  # fmt: skip

    def sync(self, state: ProxyState, request: SyncRequest) -> SyncResult:
        times = _Times()
        did_full, reasons = False, []
        no_local: dict[tuple[str, IPFamily], int] = {}
        for fam in self.families:
            reason = self._sync_family(fam, state, request, times)
            if reason:
                did_full = True
                reasons.append(reason)
            assert fam.programmed is not None
            for policy, n in fam.programmed.no_local.items():
                no_local[(policy, fam.writer.family)] = n
            self._clear_conntrack(fam, state, None if reason else request.changed)
            fam.last_state = state
        due = [t for f in self.families for t in (f.writer.deferred_until(),) if t is not None]
        return SyncResult(
            full=did_full,
            families=tuple(f.writer.family for f in self.families),
            render_seconds=times.render,
            apply_seconds=times.apply,
            no_local_endpoints=no_local,
            sync_again_in=max(0.0, min(due) - self._clock()) if due else None,
            reason=", ".join(dict.fromkeys(reasons)),
        )

    def _full_reason(self, fam: _Family[T], request: SyncRequest) -> str:
        if request.full:
            return request.reason or "asked for"
        if fam.programmed is None:
            return "nothing programmed yet"
        if not fam.trusted:
            return "the last write failed"
        return ""

    def _sync_family(
        self, fam: _Family[T], state: ProxyState, request: SyncRequest, times: _Times
    ) -> str:
        """Why this family had a full sync, or "" after a partial one."""
        w = fam.writer
        reason = self._full_reason(fam, request)
        if not reason and fam.programmed is not None:
            reason = w.before_partial(fam.programmed, self._clock())
        if not reason and fam.programmed is not None:
            programmed = fam.programmed
            t0 = self._clock()
            updates = None
            if w.cache.static_inputs(state) == programmed.static_inputs:
                updates = w.cache.updates(state, request.changed, programmed)
            t1 = self._clock()
            times.render += t1 - t0
            if updates is None:
                reason = "the node's facts or the service CIDRs changed"
            else:
                try:
                    record = w.write_partial(programmed, updates)
                except BackendError as err:
                    fam.trusted = False
                    reason = f"a partial write failed: {err}"
                    log.warning("%s: partial sync failed (%s); doing a full sync",
                                w.family.value, err)  # fmt: skip
                else:
                    programmed.apply(updates)
                    record()
                    return ""
                finally:
                    times.apply += self._clock() - t1
        t0 = self._clock()
        new = w.cache.render(state, fam.programmed)
        t1 = self._clock()
        times.render += t1 - t0
        fam.programmed, fam.trusted = new, False
        try:
            w.write_full(new)
        finally:
            times.apply += self._clock() - t1
        fam.trusted = True
        return reason

    def _clear_conntrack(
        self, fam: _Family[T], state: ProxyState, changed: Collection[NamespacedName] | None
    ) -> None:
        family = fam.writer.family
        filters = stale_filters(fam.last_state, state, family, changed)
        if filters:
            n = self._delete_conntrack(filters, family is IPFamily.IPV6)
            log.info("cleared %d stale UDP conntrack entries (%s)", n, family.value)
