"""Wiring: source -> tracker -> runner -> syncer -> backend, plus signal handling.

Threads: one per source watch (or one polling the manifests directory); the runner loop on
the main thread. Stopping (SIGTERM/SIGINT) ends the loops and releases the backend without
removing rules, so a restarted pyproxy takes over with traffic still flowing.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pyproxy.backends import registry
from pyproxy.backends.base import Backend
from pyproxy.model.events import Event
from pyproxy.runner import BoundedFrequencyRunner
from pyproxy.sources.manifests import ManifestsSource
from pyproxy.sync import Syncer
from pyproxy.tracker import ChangeTracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonConfig:
    mode: str
    node_name: str
    min_sync_period: float
    sync_period: float
    backend_options: dict[str, Any]
    manifests: Path | None = None
    kubeconfig: str | None = None
    master: str | None = None


class Daemon:
    def __init__(self, cfg: DaemonConfig, backend: Backend | None = None) -> None:
        self.cfg = cfg
        self.backend = backend or registry.create(cfg.mode, cfg.backend_options)
        self.tracker = ChangeTracker(cfg.node_name)
        self.syncer = Syncer(self.tracker, self.backend, full_sync_period=cfg.sync_period)
        self.runner = BoundedFrequencyRunner(
            self.syncer.sync,
            cfg.min_sync_period,
            cfg.sync_period,
            retry_min=max(cfg.min_sync_period, 1.0),
        )
        self.tracker.on_change = self.runner.run
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _sink(self, event: Event) -> None:
        self.tracker.apply(event)

    def start_sources(self) -> None:
        if self.cfg.manifests is not None:
            src = ManifestsSource(self.cfg.manifests, self._sink)
            t = threading.Thread(target=src.run, args=(self.stop,), name="manifests", daemon=True)
            t.start()
            self._threads.append(t)
            return
        from pyproxy.sources.apiserver import ApiServerSource, load_client

        api = load_client(self.cfg.kubeconfig, self.cfg.master)
        self._threads += ApiServerSource(api, self.cfg.node_name, self._sink).start(self.stop)

    def shutdown(self, *_: object) -> None:
        self.stop.set()
        self.runner.wake()

    def run(self) -> int:
        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received signal %d, stopping (rules stay programmed)", signum)
            self.shutdown()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log.info(
            "pyproxy starting: mode=%s node=%s source=%s",
            self.cfg.mode,
            self.cfg.node_name,
            self.cfg.manifests or "apiserver",
        )
        self.start_sources()
        try:
            self.runner.loop(self.stop)
        finally:
            self.backend.close()
        return 0
