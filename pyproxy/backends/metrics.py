"""Metric families that more than one backend owns, with upstream's names and buckets
(pkg/proxy/metrics/metrics.go). A backend registers only the families its mode has upstream,
so a scrape shows what the running mode does and nothing of another's."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

from pyproxy.model.types import IPFamily

SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))  # ExponentialBuckets(0.001, 2, 15)
FAMILY = ("ip_family",)


class SyncDurations:
    """Full and partial sync durations (upstream registers them in iptables and nftables
    mode)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.full = Histogram(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            FAMILY,
            buckets=SYNC_BUCKETS,
            registry=registry,
        )
        self.partial = Histogram(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            FAMILY,
            buckets=SYNC_BUCKETS,
            registry=registry,
        )

    def observe(self, full: bool, seconds: float, families: Iterable[IPFamily]) -> None:
        for family in families:
            (self.full if full else self.partial).labels(family.value).observe(seconds)


class RestoreFailures:
    """iptables-restore failures (upstream registers them in iptables and ipvs mode)."""

    def __init__(self, registry: CollectorRegistry, partial: bool = False) -> None:
        self.total = Counter(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            FAMILY,
            registry=registry,
        )
        self.partial = (
            Counter(
                "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
                "Cumulative proxy iptables partial restore failures",
                FAMILY,
                registry=registry,
            )
            if partial
            else None
        )

    def failed(self, family: IPFamily, partial: bool = False) -> None:
        self.total.labels(family.value).inc()
        if partial and self.partial is not None:
            self.partial.labels(family.value).inc()
