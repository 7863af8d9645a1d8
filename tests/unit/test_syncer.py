"""The syncer's full-or-partial decision: a request for a full sync from another thread (the
drift check's) is never lost, whatever moment of a sync it arrives at."""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

import pytest

import pyproxy.sync.syncer as syncer_module
from pyproxy.backends.base import Backend, BackendError, SyncRequest, SyncResult
from pyproxy.model.events import Event, EventType
from pyproxy.model.types import ProxyState
from pyproxy.serving.health import ProxyHealth
from pyproxy.sync.syncer import Syncer
from tests.helpers import endpoint, endpoint_slice, node, port, service, tracker_with


class Recording(Backend):
    mode = "recording"

    def __init__(self) -> None:
        self.requests: list[SyncRequest] = []

    def sync(self, request: SyncRequest) -> SyncResult:
        self.requests.append(request)
        return SyncResult(full=request.full)

    def render(self, state: ProxyState) -> str:
        return ""

    def cleanup(self) -> None:
        pass


def _world() -> tuple[Syncer, Recording]:
    tracker = tracker_with(
        "n1",
        node("n1"),
        service("ns", "web", "10.96.0.1", [port("http", 80)]),
        endpoint_slice("ns", "web", "web-1", [endpoint("10.1.0.1")], [port("http", 8080)]),
    )
    backend = Recording()
    syncer = Syncer(tracker, backend)
    syncer.sync()  # the first, full, sync
    return syncer, backend


def _sync_with_request_at(syncer: Syncer, line_event: int) -> int:
    """Run one sync; at its ``line_event``-th executed line of syncer.py, another thread asks
    for a full sync (and gets up to 0.2 s to finish while this one waits). Returns how many
    line events the sync had."""
    seen = 0
    threads: list[threading.Thread] = []

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal seen
        if event == "line":
            seen += 1
            if seen == line_event:
                t = threading.Thread(target=syncer.request_full, args=("drift",))
                t.start()
                t.join(0.2)  # a lock held by this thread keeps it waiting: go on
                threads.append(t)
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == syncer_module.__file__ else None

    sys.settrace(tracer)
    try:
        syncer.sync()
    finally:
        sys.settrace(None)
    for t in threads:
        t.join(5)
        assert not t.is_alive()
    return seen


def test_a_full_sync_request_during_a_sync_is_never_lost() -> None:
    syncer, _ = _world()
    lines = _sync_with_request_at(syncer, 0)  # no request: count the lines of a sync
    assert lines > 10
    for at in range(1, lines + 1):
        syncer, backend = _world()
        _sync_with_request_at(syncer, at)
        syncer.sync()
        during, after = backend.requests[1].full, backend.requests[2].full
        assert during or after, f"request at line event {at} of {lines} was lost"
        assert not (during and after), f"request at line event {at} made two full syncs"


def test_the_full_reason_is_the_request_s() -> None:
    syncer, backend = _world()
    syncer.request_full("drift")
    syncer.sync()
    assert backend.requests[1].full and syncer.last_full_reason == "drift"
    syncer.sync()
    assert not backend.requests[2].full and syncer.last_full_reason == ""


def test_generations_say_when_every_change_seen_is_programmed() -> None:
    syncer, _ = _world()
    tracker = syncer.tracker
    assert syncer.stats.programmed_generation == tracker.generation > 0
    before = tracker.generation
    tracker.apply(Event("EndpointSlice", EventType.MODIFIED,
                        endpoint_slice("ns", "web", "web-1", [endpoint("10.1.0.2")],
                                       [port("http", 8080)])))  # fmt: skip
    assert tracker.generation == before + 1 and syncer.stats.programmed_generation == before
    syncer.sync()
    assert syncer.stats.programmed_generation == tracker.generation
    tracker.apply(Event("EndpointSlice", EventType.MODIFIED,
                        endpoint_slice("ns", "web", "web-1", [endpoint("10.1.0.2")],
                                       [port("http", 8080)])))  # fmt: skip
    assert tracker.generation == before + 1  # nothing the proxy uses changed


class Failing(Recording):
    fail = False

    def sync(self, request: SyncRequest) -> SyncResult:
        if self.fail:
            raise BackendError("refused")
        return super().sync(request)


def test_health_reads_what_is_not_programmed_yet() -> None:
    """/healthz is 503 once a change has waited longer than the timeout: pending in the
    tracker, or taken by a sync that failed; 200 again after a successful sync."""
    now = [1000.0]
    tracker = tracker_with("n1", node("n1"))
    tracker._wall = lambda: now[0]  # the tracker's wall clock, for the test's timeline
    backend = Failing()
    syncer = Syncer(tracker, backend, wall=lambda: now[0])
    health = ProxyHealth(60, syncer.unprogrammed_since, lambda: tracker.node, clock=lambda: now[0])
    syncer.sync()
    assert health.status(with_node=True)[0] == 200
    tracker.apply(Event("Service", EventType.ADDED,
                        service("ns", "web", "10.96.0.1", [port("http", 80)])))  # fmt: skip
    now[0] += 61
    assert health.status(with_node=True)[0] == 503  # pending for 61 s
    backend.fail = True
    with pytest.raises(BackendError):
        syncer.sync()
    assert health.status(with_node=True)[0] == 503  # taken, but not programmed
    backend.fail = False
    syncer.sync()
    health.updated()
    assert health.status(with_node=True)[0] == 200
