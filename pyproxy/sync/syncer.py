"""One sync: take the tracker's changes, decide full or partial, call the backend, record it.

The runner (``pyproxy.sync.runner``) decides when this runs; the backend decides how rules are
written. What is recorded per sync (``SyncRecord``) feeds metrics and health: duration,
full or partial, changes applied, and network-programming latency (from the EndpointSlice's
last-change-trigger-time when present, else from when pyproxy first saw the change).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyproxy.backends.base import Backend, BackendError, SyncRequest, SyncResult
from pyproxy.model.types import ProxyState
from pyproxy.sync.tracker import ChangeTracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncRecord:
    finished: float
    """Wall-clock time the sync ended."""
    taken: float
    """Wall-clock time the sync took its snapshot of the tracker's state."""
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


@dataclass
class SyncStats:
    syncs: int = 0
    full_syncs: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_success: float | None = None


class Syncer:
    def __init__(
        self,
        tracker: ChangeTracker,
        backend: Backend,
        full_sync_period: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.tracker = tracker
        self.backend = backend
        self.full_sync_period = full_sync_period
        self._clock = clock
        self._wall = wall
        self._need_full = True
        self._last_full: float | None = None
        self._lock = threading.Lock()
        self.stats = SyncStats()
        self.listeners: list[Callable[[SyncRecord], None]] = []
        self._warned_uninitialized = False

    def sync(self) -> None:
        """Called by the runner. Raises BackendError so the runner retries with backoff."""
        if not self.tracker.initialized:
            if not self._warned_uninitialized:
                log.info("not syncing until Services and EndpointSlices have been listed")
                self._warned_uninitialized = True
            return
        with self._lock:
            self._sync_locked()

    def _sync_locked(self) -> None:
        start = self._clock()
        taken = self._wall()
        changes = self.tracker.take()
        full = (
            self._need_full
            or changes.node_changed
            or self._last_full is None
            or start - self._last_full >= self.full_sync_period
        )
        request = SyncRequest(changes.state, changes.changed_services, full)
        try:
            result = self.backend.sync(request)
        except Exception as err:
            self._need_full = True  # the changes are consumed: only a full sync is safe now
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            if not isinstance(err, BackendError):
                log.exception("backend crashed during sync")
            self._record(
                SyncRecord(
                    self._wall(),
                    taken,
                    self._clock() - start,
                    full,
                    False,
                    changes.service_changes,
                    changes.endpoint_changes,
                    error=msg,
                )
            )
            raise BackendError(msg) from err
        end_wall, end = self._wall(), self._clock()
        self._need_full = False
        if result.full:
            self._last_full = start
        latencies = [end_wall - t for times in changes.trigger_times.values() for t in times]
        if not latencies and changes.first_seen is not None:
            latencies = [end - changes.first_seen]
        rec = SyncRecord(
            end_wall,
            taken,
            end - start,
            result.full,
            True,
            changes.service_changes,
            changes.endpoint_changes,
            tuple(max(0.0, x) for x in latencies),
            result=result,
            state=changes.state,
        )
        self._record(rec)
        log.info(
            "synced %s in %.3fs (%d service, %d endpoint changes)",
            "fully" if result.full else "partially",
            rec.duration,
            changes.service_changes,
            changes.endpoint_changes,
        )

    def _record(self, rec: SyncRecord) -> None:
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
