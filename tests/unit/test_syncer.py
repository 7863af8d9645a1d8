"""The syncer's full-or-partial decision: a request for a full sync from another thread (the
drift check's) is never lost, whatever moment of a sync it arrives at."""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

import pyproxy.sync.syncer as syncer_module
from pyproxy.backends.base import Backend, SyncRequest, SyncResult
from pyproxy.model.types import ProxyState
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
