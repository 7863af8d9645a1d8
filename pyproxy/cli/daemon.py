"""Wiring: source -> tracker -> runner -> syncer -> backend, plus the operator endpoints.

Threads: one per source watch (or one polling the manifests directory), one per HTTP server,
and the runner loop on the main thread. Stopping (SIGTERM/SIGINT) ends the loops and releases
the backend without removing rules, so a restarted pyproxy takes over with traffic flowing.
"""

from __future__ import annotations

import faulthandler
import ipaddress
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from types import FrameType
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from pyproxy.backends import registry
from pyproxy.backends.base import Backend, BackendError
from pyproxy.cli import memory
from pyproxy.cli.walk import walk_of, with_local_addresses
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import sysctl
from pyproxy.model.events import Event
from pyproxy.model.types import NamespacedName, ProxyState
from pyproxy.serving.debug import DebugView
from pyproxy.serving.health import (
    ProxyHealth,
    Route,
    ServiceHealthServer,
    health_routes,
    metrics_routes,
    serve,
)
from pyproxy.serving.metrics import Metrics
from pyproxy.serving.service_metrics import ServiceTrafficCollector
from pyproxy.sources.manifests import ManifestsSource
from pyproxy.sync.runner import BoundedFrequencyRunner
from pyproxy.sync.syncer import Syncer, SyncRecord
from pyproxy.sync.tracker import ChangeTracker
from pyproxy.tools.explain import Walk, explain, explain_data

T = TypeVar("T")
log = logging.getLogger(__name__)

FAILURES_BEFORE_EVENT = 3


class Daemon:
    def __init__(self, cfg: ProxyConfig, backend: Backend | None = None) -> None:
        cfg = replace(cfg, mode=registry.get(cfg.mode).name)  # "" is the default mode
        self.cfg = cfg
        # A test's stand-in backend must not touch this kernel: no conntrack settings, no
        # leftovers removed. The other modes' objects go after this mode's first full sync, not
        # before (upstream removes them first): a node switching modes keeps serving throughout.
        self.owns_kernel = backend is None
        self.leftovers_pending = self.owns_kernel
        self.backend = backend or registry.create(cfg)
        self.tracker = ChangeTracker(cfg.node_name)
        self.syncer = Syncer(self.tracker, self.backend)
        self.runner = BoundedFrequencyRunner(
            self.syncer.sync,
            cfg.min_sync_period,
            cfg.sync_period,
            retry_min=max(cfg.min_sync_period, 1.0),
        )
        self.metrics = Metrics(CollectorRegistry())
        self.backend.register_metrics(self.metrics.registry)
        if cfg.service_metrics:
            self.metrics.registry.register(ServiceTrafficCollector(
                self.backend.service_traffic, cfg.service_metrics_max_series))  # fmt: skip
        self.metrics.read(self.tracker)
        self.health = ProxyHealth(2 * cfg.sync_period, self.syncer.unprogrammed_since,
                                  lambda: self.tracker.node)  # fmt: skip
        host = cfg.healthz_address[0] if cfg.healthz_address else "0.0.0.0"
        self.service_health = ServiceHealthServer(
            host=host if host not in ("127.0.0.1", "::1") else "0.0.0.0",
            proxy_healthy=lambda: self.health.status(with_node=False)[0] == 200,
        )
        self.tracker.on_change = self.runner.run
        self.syncer.listeners += [self.metrics.observe, self._on_sync]
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.post_event: Callable[[str, str, str], None] | None = None
        self.debug = DebugView(
            state=self.tracker.current_state,
            status=self.status,
            skipped=lambda: list(self.tracker.skipped_recent),
            transactions=self.backend.transactions,
            explain=lambda st, svc, port: self._explain(explain, st, svc, port),
            explain_data=lambda st, svc, port: self._explain(explain_data, st, svc, port),
            traffic=self.backend.service_traffic,
            diff=lambda: self.backend.compare(self.tracker.current_state()),
        )

    def _explain(self, tool: Callable[[ProxyState, NamespacedName, str | None, Walk], T],
                 state: ProxyState, svc: NamespacedName, port: str | None) -> T:  # fmt: skip
        """/debug/explain: over the state with this node's addresses (for NodePorts and the
        rules' local-address tests), with this mode's walk, which is not kept afterwards."""
        state = with_local_addresses(state)
        try:
            return tool(state, svc, port, walk_of(self.cfg, self.backend, state))
        finally:
            self.backend.forget_walks()

    def status(self) -> dict[str, Any]:
        """Mode, the last sync and what waits for the next, for /debug/state."""
        services, endpoints = self.tracker.pending_counts()
        rec = self.syncer.last_record
        return {
            "mode": self.cfg.mode,
            "nodeName": self.cfg.node_name,
            "lastSync": None if rec is None else {
                "finished": rec.finished, "seconds": round(rec.duration, 6), "full": rec.full,
                "fullReason": rec.reason or None, "ok": rec.ok, "error": rec.error or None,
                "serviceChanges": rec.service_changes, "endpointChanges": rec.endpoint_changes,
            },
            "lastFullSync": {"finished": full.finished, "reason": full.reason}
            if (full := self.syncer.last_full) is not None
            else None,
            "syncs": self.syncer.stats.syncs,
            "fullSyncs": self.syncer.stats.full_syncs,
            "failedSyncs": self.syncer.stats.failures,
            "pending": {"serviceChanges": services, "endpointChanges": endpoints},
            # Changes seen and changes programmed: equal once every change seen is in the
            # kernel (what a test or a probe waits on instead of reading the log).
            "generation": {"observed": self.tracker.generation,
                           "programmed": self.syncer.stats.programmed_generation},
            "skippedCounts": dict(self.tracker.skipped),
            "backend": self.backend.debug_state(),
        }  # fmt: skip

    # ---- after a sync ---------------------------------------------------------------------

    def _on_sync(self, rec: SyncRecord) -> None:
        """What a sync changes beyond the kernel: health, health-check node ports, the
        leftovers of other modes after the first full sync, an event after repeated
        failures. (Metrics observe the record themselves; deferred work goes back to the
        runner as the sync's return value.)"""
        if rec.ok and rec.state is not None:
            if rec.full:
                memory.after_full_sync()
                if self.leftovers_pending:
                    self.leftovers_pending = False
                    self.cleanup_other_modes()
            self.health.updated()
            self.service_health.sync(rec.state, None if rec.full else rec.changed)
        elif self.syncer.stats.consecutive_failures == FAILURES_BEFORE_EVENT and self.post_event:
            self.post_event(
                "Warning",
                "SyncProxyRulesFailed",
                f"{FAILURES_BEFORE_EVENT} syncs in a row failed: {rec.error}",
            )

    def _sink(self, event: Event) -> None:
        self.tracker.apply(event)

    # ---- lifecycle ----------------------------------------------------------------------

    def start_servers(self) -> None:
        def count(path: str, code: int) -> None:
            (self.metrics.healthz if path == "/healthz" else self.metrics.livez).labels(
                str(code)
            ).inc()

        if self.cfg.healthz_address:
            try:
                serve(*self.cfg.healthz_address, health_routes(self.health, count), "healthz")
            except OSError as err:
                log.error("cannot serve healthz on %s:%d: %s", *self.cfg.healthz_address, err)
        if self.cfg.metrics_address:
            try:
                serve(
                    *self.cfg.metrics_address,
                    metrics_routes(self.metrics.registry, self.cfg.mode, self.debug_routes()),
                    "metrics",
                )
            except OSError as err:
                log.error("cannot serve metrics on %s:%d: %s", *self.cfg.metrics_address, err)

    def debug_routes(self) -> Route | None:
        """/debug/* only on a loopback metrics address (the default): one open to the network
        for Prometheus (the DaemonSet's) would show every service and endpoint to anything
        that reaches the node. SIGUSR1 writes the same to the log either way."""
        assert self.cfg.metrics_address is not None
        try:
            loopback = ipaddress.ip_address(self.cfg.metrics_address[0]).is_loopback
        except ValueError:
            loopback = self.cfg.metrics_address[0] == "localhost"
        if not loopback:
            log.info("/debug endpoints off: the metrics address %s is not loopback",
                     self.cfg.metrics_address[0])  # fmt: skip
            return None
        return self.debug.routes()

    def start_sources(self) -> None:
        if self.cfg.source.manifests is not None:
            src = ManifestsSource(self.cfg.source.manifests, self._sink)
            t = threading.Thread(target=src.run, args=(self.stop,), name="manifests", daemon=True)
            t.start()
            self._threads.append(t)
            return
        from pyproxy.sources.apiserver import ApiServerSource, EventRecorder, load_client

        api = load_client(self.cfg.source.kubeconfig, self.cfg.source.master)
        source = ApiServerSource(api, self.cfg.node_name, self._sink)
        source.on_reconnect = lambda kind: self.metrics.reconnects.labels(kind).inc()
        source.on_relist = lambda kind: self.metrics.relists.labels(kind).inc()
        recorder = EventRecorder(api, self.cfg.node_name)
        self.post_event = recorder.post
        recorder.post("Normal", "Starting", f"Starting pyproxy ({self.cfg.mode} mode).")
        self._threads += source.start(self.stop)

    def watch_canary(self) -> None:
        """Upstream's iptables Monitor: every sync period, a cheap look at whether someone
        removed what the backend programmed; if so, the next sync is full and runs now."""
        while not self.stop.wait(self.cfg.sync_period):
            try:
                drifted = self.backend.drifted()
            except Exception:  # a failed probe must not end the watch
                log.exception("canary check failed")
                continue
            if drifted:
                log.warning("pyproxy's rules were flushed or edited by another program: "
                            "syncing fully")  # fmt: skip
                self.syncer.request_full("rules changed by another program")
                self.runner.run()

    def log_dump(self) -> None:
        log.info("state and rules (SIGUSR1):\n%s", self.debug.dump())

    def cleanup_other_modes(self) -> None:
        """Best effort, as upstream: a failure is a log line, never the end of the process."""
        # What a start in each mode removes (its Mode.leftovers), as upstream's platformCleanup
        # (cmd/kube-proxy/app/server_linux.go): they carry kube-proxy's names, so this also
        # cleans a node kube-proxy served in another mode.
        for mode in registry.get(self.cfg.mode).leftovers:
            try:
                other = registry.create(replace(self.cfg, mode=mode))
                try:
                    other.cleanup()
                finally:
                    other.close()
            except Exception as err:  # e.g. no IPVS in this kernel
                log.warning("cleaning up what %s mode left: %s", mode, err)
        # What another mode leaves serving beyond its process (ebpf's pinned programs, which
        # would go on balancing sockets around this mode's rules): gone too.
        for m in registry.modes():
            if m.name == self.cfg.mode or m.outlives is None:
                continue
            try:
                n = m.outlives(self.cfg)
            except Exception as err:
                log.warning("removing what %s mode left: %s", m.name, err)
            else:
                if n:
                    log.info("removed %d objects %s mode left", n, m.name)

    def set_conntrack(self) -> None:
        """The node's conntrack settings, as upstream's platformSetup writes them before its
        proxier starts; one that cannot be written ends the start with one line (a read-only
        /proc/sys stays read-only: deploy/base sets them to 0, leaving the node's)."""
        ct = self.cfg.conntrack
        size = ct.table_size(os.cpu_count() or 1)
        why = sysctl.ensure_conntrack_max(size) if size else ""
        for name, value in ct.sysctls():
            why = why or sysctl.ensure(name, str(value))  # the first failure ends it
        if why:
            raise BackendError(f"could not set conntrack parameters: {why}")

    def shutdown(self, *_: object) -> None:
        self.stop.set()
        self.runner.wake()

    def run(self) -> int:
        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received signal %d, stopping (rules stay programmed)", signum)
            self.shutdown()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # SIGQUIT writes every thread's stack to stderr and carries on (a Go daemon such as
        # upstream's dumps its goroutines on SIGQUIT): where a stuck sync is stuck.
        faulthandler.register(signal.SIGQUIT, file=sys.stderr, all_threads=True)
        # SIGUSR1 writes /debug/state and /debug/rules to the log, from a thread of its own:
        # the handler runs on the main thread, which may hold the tracker's lock mid-sync.
        signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(
            target=self.log_dump, name="dump", daemon=True).start())  # fmt: skip
        log.info(
            "pyproxy starting: mode=%s node=%s source=%s",
            self.cfg.mode,
            self.cfg.node_name,
            self.cfg.source.manifests or "apiserver",
        )
        if self.owns_kernel:
            self.set_conntrack()
        self.backend.prepare()  # a mode that cannot work here ends the process now
        self.health.updated()  # as upstream: healthy while starting up
        self.start_servers()
        self.start_sources()
        threading.Thread(target=self.watch_canary, name="canary", daemon=True).start()
        try:
            self.runner.loop(self.stop)
        finally:
            self.service_health.close()
            self.backend.close()
        return 0
