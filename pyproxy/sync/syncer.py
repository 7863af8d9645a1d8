"""One sync: take the tracker's changes, decide full or partial, call the backend, record it.

The runner (``pyproxy.sync.runner``) decides when this runs; the backend decides how rules are
written. Full or partial follows upstream's cadence: a full sync at start, after a failed sync,
when the node's labels change, when asked (the backend's canary saw a flush), and otherwise at
most once per ``full_sync_period`` (an hour); every other sync is partial, and with nothing
changed it writes nothing. What is recorded per sync (``SyncRecord``) feeds metrics and
health: duration, full or partial, changes applied, and network-programming latency (from the
EndpointSlice's last-change-trigger-time when present, else from when pyproxy first saw the
change).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyproxy.backends.base import Backend, BackendError, SyncRequest, SyncResult
from pyproxy.model.types import NamespacedName, ProxyState
from pyproxy.sync.tracker import ChangeTracker

log = logging.getLogger(__name__)

FULL_SYNC_PERIOD = 3600.0
"""Upstream's proxyutil.FullSyncPeriod: without a reason to, a full sync runs at most hourly."""


@dataclass(frozen=True)
class SyncRecord:
    finished: float
    """Wall-clock time the sync ended."""
    duration: float
    full: bool
    ok: bool
    service_changes: int
    endpoint_changes: int
    latencies: tuple[float, ...] = ()
    error: str = ""
    result: SyncResult | None = None
    state: ProxyState | None = None
    """The state this sync programmed (successful syncs only); handed to listeners, not
    kept."""
    changed: frozenset[NamespacedName] = frozenset()
    """The services this sync's changes touched (all of them matter after a full sync)."""
    reason: str = ""
    """Why it was (or was to be) full; "" for a partial sync."""


@dataclass
class SyncStats:
    syncs: int = 0
    full_syncs: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_success: float | None = None
    programmed_generation: int = 0
    """The tracker's generation the last successful sync programmed."""


class Syncer:
    def __init__(
        self,
        tracker: ChangeTracker,
        backend: Backend,
        full_sync_period: float = FULL_SYNC_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.tracker = tracker
        self.backend = backend
        self.full_sync_period = full_sync_period
        self._clock = clock
        self._wall = wall
        self._requested: str | None = "start"
        """Why the next sync must be full (None: nothing asked); guarded by _request_lock."""
        self._request_lock = threading.Lock()
        self.last_full_reason = ""
        """Why the last successful sync was full ("" after a partial one)."""
        self.last_record: SyncRecord | None = None
        self._failed_since: float | None = None
        """Wall-clock time of the oldest change a failed sync took (it is not programmed)."""
        self.last_full: SyncRecord | None = None
        """The last successful full sync (its reason and when), for /debug/state."""
        self._last_full_at: float | None = None
        self._lock = threading.Lock()
        self.stats = SyncStats()
        self.listeners: list[Callable[[SyncRecord], None]] = []
        self._warned_uninitialized = False

    def request_full(self, reason: str) -> None:
        """Make the next sync a full one. Called from other threads (the drift check) while a
        sync runs: the request and its consumption are each one step under a lock of their
        own, so a request is either taken by the sync that reads it or left for the next,
        never lost (the sync's own lock is held for a whole sync: waiting on it would hold
        up the caller for as long)."""
        with self._request_lock:
            if self._requested is None:
                self._requested = reason

    def sync(self) -> bool | float:
        """Called by the runner: False when there is nothing to sync yet; after a sync, True,
        or the seconds after which the backend has deferred work (the runner runs again by
        then). Raises BackendError so the runner retries with backoff."""
        if not self.tracker.initialized:
            if not self._warned_uninitialized:
                log.info("not syncing until Services, EndpointSlices, the Node and ServiceCIDRs "
                         "have been listed")  # fmt: skip
                self._warned_uninitialized = True
            return False
        with self._lock:
            again = self._sync_locked()
        return True if again is None else again

    def _sync_locked(self) -> float | None:
        start = self._clock()
        with self._request_lock:
            requested, self._requested = self._requested, None
        changes = self.tracker.take()
        reason = self._full_reason(start, requested, changes.full_reason)
        full = bool(reason)
        request = SyncRequest(changes.state, changes.changed_services, full, reason,
                              changes.first_seen)  # fmt: skip
        try:
            result = self.backend.sync(request)
        except Exception as err:
            self.request_full("previous sync failed")  # the changes are consumed
            seen, since = changes.first_seen_wall, self._failed_since
            if seen is not None:
                self._failed_since = seen if since is None else min(since, seen)
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            if not isinstance(err, BackendError):
                log.exception("backend crashed during sync")
            self._record(
                SyncRecord(
                    self._wall(),
                    self._clock() - start,
                    full,
                    False,
                    changes.service_changes,
                    changes.endpoint_changes,
                    error=msg,
                    reason=reason,
                )
            )
            raise BackendError(msg) from err
        end_wall, end = self._wall(), self._clock()
        self.stats.programmed_generation = changes.generation
        self._failed_since = None  # a sync after a failure is full: everything is programmed
        if result.full:
            self._last_full_at = start
            reason = reason or result.reason or "the backend needed one"
        self.last_full_reason = reason if result.full else ""
        latencies = [end_wall - t for times in changes.trigger_times.values() for t in times]
        if not latencies and changes.first_seen is not None:
            latencies = [end - changes.first_seen]
        rec = SyncRecord(
            end_wall,
            end - start,
            result.full,
            True,
            changes.service_changes,
            changes.endpoint_changes,
            tuple(max(0.0, x) for x in latencies),
            result=result,
            state=changes.state,
            changed=changes.changed_services,
            reason=self.last_full_reason,
        )
        if rec.full:
            self.last_full = rec
        self._record(rec)
        idle = not result.full and not changes.changed_services
        log.log(
            logging.DEBUG if idle else logging.INFO,
            "synced %s in %.3fs (%d service, %d endpoint changes)%s",
            "fully" if result.full else "partially",
            rec.duration,
            changes.service_changes,
            changes.endpoint_changes,
            f" ({reason})" if result.full else "",
        )
        return result.sync_again_in

    def _full_reason(self, now: float, requested: str | None, from_changes: str) -> str:
        """Why this sync must be full, or "" (partial): asked for (start, a failed sync, the
        drift check), the node's labels or the service CIDRs changed, or an hour since the
        last full sync."""
        if requested:
            return requested
        if from_changes:
            return from_changes
        if self._last_full_at is None:
            return "start"
        if now - self._last_full_at >= self.full_sync_period:
            return "periodic"
        return ""

    def unprogrammed_since(self) -> float | None:
        """Wall-clock time of the oldest change not programmed yet: pending in the tracker,
        or taken by a sync that failed (None: every change is in the kernel). Health reads
        it when asked."""
        pending = self.tracker.pending_since()
        failed = self._failed_since
        if pending is None or failed is None:
            return pending if failed is None else failed
        return min(pending, failed)

    def _record(self, rec: SyncRecord) -> None:
        self.last_record = rec
        s = self.stats
        s.syncs += 1
        if rec.ok:
            s.last_success = rec.finished
            s.full_syncs += rec.full
            s.consecutive_failures = 0
        else:
            s.failures += 1
            s.consecutive_failures += 1
        for fn in self.listeners:
            try:
                fn(rec)
            except Exception:
                log.exception("sync listener failed")
