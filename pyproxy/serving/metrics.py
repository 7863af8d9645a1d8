"""The core Prometheus metrics, registered in every mode, with kube-proxy's names, types,
labels and buckets (pkg/proxy/metrics/metrics.go ``RegisterMetrics``), so existing dashboards
and alerts keep working; plus a few of pyproxy's own (``pyproxy_*``): render vs apply time,
skipped objects, watch reconnects.

Fed by ``SyncRecord``s from the syncer; the gauges of what waits for a sync read the tracker
when scraped. The families only
some modes have (iptables rule counts, full/partial durations, ...) are registered and kept by
the backend itself (``Backend.register_metrics``): nothing here knows a backend.
"""

from __future__ import annotations

import functools

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from pyproxy.backends.metrics import FAMILY, SYNC_BUCKETS
from pyproxy.model.events import KINDS
from pyproxy.model.types import IPFamily
from pyproxy.sync.syncer import SyncRecord
from pyproxy.sync.tracker import ChangeTracker

NETWORK_PROGRAMMING_BUCKETS = (
    0.25,
    0.5,
    *(float(i) for i in range(1, 60)),
    *(float(i) for i in range(60, 120, 5)),
    *(float(i) for i in range(120, 301, 30)),
)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # upstream has no *_created
        self._tracker: ChangeTracker | None = None
        self._queued_families: set[IPFamily] = set()
        self.registry = r = registry
        self.sync_duration = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            FAMILY,
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.last_timestamp = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            FAMILY,
            registry=r,
        )
        self.last_queued = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            FAMILY,
            registry=r,
        )
        self.network_programming = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            FAMILY,
            buckets=NETWORK_PROGRAMMING_BUCKETS,
            registry=r,
        )
        # prometheus-client appends _total to counter names itself.
        self.service_changes = Counter(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            registry=r,
        )
        self.endpoint_changes = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            registry=r,
        )
        self.service_pending = Gauge(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            registry=r,
        )
        self.endpoint_pending = Gauge(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            registry=r,
        )
        self.no_local_endpoints = Gauge(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            ("traffic_policy", "ip_family"),
            registry=r,
        )
        self.healthz = Counter(
            "kubeproxy_proxy_healthz", "Cumulative proxy healthz HTTP status", ("code",), registry=r
        )
        self.livez = Counter(
            "kubeproxy_proxy_livez", "Cumulative proxy livez HTTP status", ("code",), registry=r
        )
        # pyproxy's own
        self.phase = Histogram(
            "pyproxy_sync_phase_duration_seconds",
            "Time spent rendering vs applying rules per sync",
            ("phase",),
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.skipped = Gauge(
            "pyproxy_skipped_objects", "Objects skipped as invalid, by kind", ("kind",), registry=r
        )
        self.reconnects = Counter(
            "pyproxy_watch_reconnects",
            "API watch connections re-established, by kind",
            ("kind",),
            registry=r,
        )
        self.relists = Counter(
            "pyproxy_watch_relists",
            "Full relists after the first (410 Gone or an error), by kind",
            ("kind",),
            registry=r,
        )
        self.sync_failures = Counter("pyproxy_sync_failures", "Syncs that failed", registry=r)

    def read(self, tracker: ChangeTracker) -> None:
        """The gauges of what waits for a sync read the tracker at each scrape (nothing feeds
        them on the way from the source to the sync)."""
        self._tracker = tracker
        self.service_pending.set_function(lambda: tracker.pending_counts()[0])
        self.endpoint_pending.set_function(lambda: tracker.pending_counts()[1])
        for kind in KINDS:
            self.skipped.labels(kind).set_function(functools.partial(_count, tracker, kind))
        self._queued_for(IPFamily.IPV4)

    def _queued_for(self, family: IPFamily) -> None:
        tracker = self._tracker
        if tracker is not None and family not in self._queued_families:
            self._queued_families.add(family)
            self.last_queued.labels(family.value).set_function(lambda: tracker.last_queued or 0)

    def observe(self, rec: SyncRecord) -> None:
        if not rec.ok or rec.result is None:
            self.sync_failures.inc()
            return
        res = rec.result
        for fam in res.families:
            self._queued_for(fam)
        self.service_changes.inc(rec.service_changes)
        self.endpoint_changes.inc(rec.endpoint_changes)
        self.phase.labels("render").observe(res.render_seconds)
        self.phase.labels("apply").observe(res.apply_seconds)
        for fam in res.families:
            self.sync_duration.labels(fam.value).observe(rec.duration)
            self.last_timestamp.labels(fam.value).set(rec.finished)
            for latency in rec.latencies:
                self.network_programming.labels(fam.value).observe(latency)
        for (policy, fam), value in res.no_local_endpoints.items():
            self.no_local_endpoints.labels(policy, fam.value).set(value)


def _count(tracker: ChangeTracker, kind: str) -> float:
    return tracker.skipped[kind]
