"""Bounded-frequency runner, driven by a fake clock (no sleeps, no threads)."""

from __future__ import annotations

import pytest

from pyproxy.sync.runner import BoundedFrequencyRunner


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(min_i: float = 1.0, max_i: float = 30.0, fail: list[bool] | None = None):
    clock = Clock()
    calls: list[float] = []
    fails = fail if fail is not None else []

    def fn() -> None:
        calls.append(clock.t)
        if fails and fails.pop(0):
            raise RuntimeError("boom")

    return BoundedFrequencyRunner(fn, min_i, max_i, retry_min=1.0, clock=clock), clock, calls


def test_first_run_is_immediate_then_at_most_once_per_min_interval() -> None:
    r, clock, calls = make()
    r.tick()
    assert calls == [1000.0]
    for _ in range(50):  # a burst of requests within min_interval
        r.run()
        clock.t += 0.01
        r.tick()
    assert len(calls) == 1
    clock.t = 1001.0
    r.tick()
    assert len(calls) == 2  # the burst was coalesced into one run
    r.tick()
    assert len(calls) == 2


def test_runs_at_least_once_per_max_interval() -> None:
    r, clock, calls = make(max_i=30.0)
    r.tick()
    clock.t += 29.9
    r.tick()
    assert len(calls) == 1
    clock.t += 0.1
    r.tick()
    assert len(calls) == 2


def test_failure_retries_with_backoff_and_never_raises() -> None:
    r, clock, calls = make(min_i=0.0, fail=[True, True, True, False])
    r.tick()
    assert r.failures == 1
    clock.t += 0.5
    r.tick()
    assert len(calls) == 1  # retry after 1s
    clock.t += 0.5
    r.tick()
    assert len(calls) == 2 and r.failures == 2
    clock.t += 1.5
    r.tick()
    assert len(calls) == 2  # backoff doubled to 2s
    clock.t += 0.5
    r.tick()
    assert len(calls) == 3
    clock.t += 4.0
    r.tick()
    assert len(calls) == 4 and r.failures == 3  # then success


def test_next_due_and_validation() -> None:
    r, clock, _ = make(min_i=2.0)
    r.tick()
    r.run()
    assert r.next_due() == clock.t + 2.0
    with pytest.raises(ValueError):
        BoundedFrequencyRunner(lambda: None, 5.0, 1.0)


def test_a_run_that_did_nothing_does_not_delay_the_first_sync() -> None:
    clock = Clock()
    ready = False
    calls: list[float] = []

    def fn() -> bool:
        calls.append(clock.t)
        return ready

    r = BoundedFrequencyRunner(fn, 1.0, 30.0, clock=clock)
    r.tick()  # the state is not listed yet: nothing done
    ready = True
    clock.t += 0.1
    r.run()  # the lists arrived
    r.tick()
    assert calls == [1000.0, 1000.1]  # not held back until 1001.0


def test_a_run_asked_for_later_happens_then_and_not_before() -> None:
    r, clock, calls = make(min_i=1.0, max_i=3600.0)
    r.tick()
    r.run_in(5.0)
    clock.t += 4.9
    r.tick()
    assert len(calls) == 1
    clock.t += 0.2
    r.tick()
    assert len(calls) == 2


def test_intervals_count_from_the_end_of_a_run() -> None:
    """As upstream: a 5 s sync followed by a request waits min_interval after it ended, and
    the periodic run comes max_interval after the end too."""
    clock = Clock()
    calls: list[float] = []

    def slow() -> None:
        calls.append(clock.t)
        clock.t += 5.0  # the sync takes 5 s

    r = BoundedFrequencyRunner(slow, 1.0, 30.0, clock=clock)
    r.tick()  # runs 1000 .. 1005
    r.run()
    assert r.next_due() == 1006.0
    clock.t = 1005.5
    r.tick()
    assert calls == [1000.0]  # not yet: 0.5 s after the end
    clock.t = 1006.0
    r.tick()  # runs 1006 .. 1011
    assert calls == [1000.0, 1006.0]
    assert r.next_due() == 1041.0


def test_a_run_that_did_nothing_waits_for_a_request() -> None:
    """No spinning while the state is incomplete: the next run waits for run()."""
    clock = Clock()
    calls: list[float] = []

    def fn() -> bool:
        calls.append(clock.t)
        return False

    r = BoundedFrequencyRunner(fn, 1.0, 30.0, clock=clock)
    r.tick()
    for _ in range(5):
        clock.t += 0.1
        r.tick()
    assert calls == [1000.0]
    r.run()
    r.tick()
    assert len(calls) == 2 and calls[1] > 1000.4


def test_a_run_that_returns_seconds_has_the_next_run_by_then() -> None:
    """Deferred work (chains to delete a second on) comes back through the runner."""
    clock = Clock()
    calls: list[float] = []

    def fn() -> float | bool:
        calls.append(clock.t)
        return 2.5 if len(calls) == 1 else True

    r = BoundedFrequencyRunner(fn, 1.0, 30.0, clock=clock)
    r.tick()
    clock.t += 2.4
    r.tick()
    assert calls == [1000.0]
    clock.t += 0.1
    r.tick()
    assert calls == [1000.0, 1002.5]
    clock.t += 10
    r.tick()
    assert calls == [1000.0, 1002.5]  # True: nothing deferred, the maximum interval applies
