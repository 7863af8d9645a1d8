"""Bounded-frequency runner: decides *when* a sync runs, never what it does.

Guarantees, as upstream's BoundedFrequencyRunner: ``min_interval`` between the end of one run
and the start of the next (requests in between coalesce into one), a run at least
``max_interval`` after the previous one ended, and after a
failed run a retry with exponential backoff (``retry_min`` doubling up to ``max_interval``).
A failing function is logged and retried; it never ends the loop. A function that returns
False did nothing (the state is not complete yet): that run does not start the
``min_interval`` window, so the first real sync runs as soon as it is asked for, and not
before (no spinning). A function that returns a number of seconds has deferred work (a
backend deleting chains it flushed a second ago): the next run comes no later than that.

The decision logic is in ``tick()``, driven by an injectable clock, so it is tested without
threads or sleeps; ``loop()`` is the thin thread around it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class BoundedFrequencyRunner:
    def __init__(
        self,
        fn: Callable[[], bool | float | None],
        min_interval: float,
        max_interval: float,
        retry_min: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        name: str = "sync-runner",
    ) -> None:
        if max_interval <= 0 or min_interval < 0 or min_interval > max_interval:
            raise ValueError("need 0 <= min_interval <= max_interval and max_interval > 0")
        self._fn = fn
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.retry_min = max(retry_min, min_interval, 0.001)
        self._clock = clock
        self.name = name
        self._cond = threading.Condition()
        self._requested = True  # the first run happens as soon as allowed
        self._last_run: float | None = None
        self._retry_at: float | None = None
        self._wanted_at: float | None = None
        self._retry_delay = 0.0
        self.runs = 0
        self.failures = 0

    def run(self) -> None:
        """Ask for a run soon (coalesced with other requests within ``min_interval``)."""
        with self._cond:
            self._requested = True
            self._cond.notify_all()

    def run_in(self, seconds: float) -> None:
        """Ask for a run no later than ``seconds`` from now (a backend with deferred work,
        such as deleting chains it flushed, asks for one)."""
        with self._cond:
            at = self._clock() + seconds
            self._wanted_at = at if self._wanted_at is None else min(self._wanted_at, at)
            self._cond.notify_all()

    def next_due(self) -> float:
        """Clock time at which the next run is due."""
        with self._cond:
            return self._next_due_locked()

    def _next_due_locked(self) -> float:
        if self._last_run is None:
            # Never ran (or only did nothing): due when asked, and only then. Re-running a
            # function that did nothing at once would spin while the lists arrive, holding
            # the GIL the sources need (12 s instead of 4 to list 5,000 services).
            return float("-inf") if self._requested else float("inf")
        earliest = self._last_run + self.min_interval
        due = self._last_run + self.max_interval
        if self._requested:
            due = earliest
        if self._retry_at is not None:
            due = min(due, max(self._retry_at, earliest))
        if self._wanted_at is not None:
            due = min(due, max(self._wanted_at, earliest))
        return due

    def tick(self) -> float:
        """Run the function if it is due; return the seconds until the next check."""
        with self._cond:
            now = self._clock()
            due = self._next_due_locked()
            if now < due:
                return due - now
            self._requested = False
            self._retry_at = None
            self._wanted_at = None
            previous, self._last_run = self._last_run, now
        try:
            result = self._fn()
            did = result is not False
            with self._cond:  # the intervals count from the run's end, as upstream's
                self._last_run = self._clock() if did else previous
            if type(result) is float:
                self.run_in(result)
        except Exception as err:  # a sync failure must never end the loop
            with self._cond:
                self._last_run = self._clock()
                self.failures += 1
                self._retry_delay = min(
                    self.max_interval,
                    self._retry_delay * 2 if self._retry_delay else self.retry_min,
                )
                self._retry_at = now + self._retry_delay
            log.error("%s: sync failed (retrying in %.1fs): %s", self.name, self._retry_delay, err)
        else:
            with self._cond:
                self._retry_delay = 0.0
        finally:
            with self._cond:
                self.runs += 1
        with self._cond:
            return max(0.0, self._next_due_locked() - self._clock())

    def loop(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set. Uses real time for waiting."""
        while not stop.is_set():
            delay = self.tick()
            with self._cond:
                if not stop.is_set() and delay > 0:
                    self._cond.wait(timeout=min(delay, 1.0))

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()
