"""The configuration object every part of pyproxy is built from: frozen, typed, validated.

Only ``pyproxy.config.load`` makes one from flags and a file; tests build them directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from pyproxy.model.nodeports import NodePortAddresses
from pyproxy.model.types import IPFamily, IPNetwork, NodeInfo

IPTABLES_BACKENDS = ("auto", "nft", "legacy")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


class DetectLocalMode(StrEnum):
    """How traffic from this cluster's pods is recognised (upstream's detectLocalMode)."""

    CLUSTER_CIDR = "ClusterCIDR"
    NODE_CIDR = "NodeCIDR"


@dataclass(frozen=True)
class Masquerade:
    """The shared SNAT settings: every mode marks with the same bit."""

    bit: int = 14
    all: bool = False

    @property
    def mark(self) -> str:
        """The mark as upstream writes it in rules (0x4000 for bit 14)."""
        return f"{1 << self.bit:#x}"


@dataclass(frozen=True)
class Conntrack:
    """The node's conntrack settings kube-proxy writes at start (its ``conntrack`` section,
    upstream's defaults): a table of ``max_per_core`` x CPUs entries, at least ``min`` (0:
    leave the table's size alone, which a node in a network namespace of its own must, since
    only the machine's first namespace may write it), and the timeouts of established and
    CLOSE_WAIT TCP flows and of UDP flows (0: leave the kernel's). Upstream's e2e "KubeProxy
    should set TCP CLOSE_WAIT timeout" expects the hour."""

    max_per_core: int = 32768
    min: int = 131072
    tcp_established_timeout: float = 86400.0
    tcp_close_wait_timeout: float = 3600.0
    tcp_be_liberal: bool = False
    udp_timeout: float = 0.0
    udp_stream_timeout: float = 0.0

    def table_size(self, cpus: int) -> int:
        """nf_conntrack_max to write (0: none), as upstream's getConntrackMax: the scaled
        size, capped at 1,048,576, or ``min`` if that is larger."""
        if self.max_per_core <= 0:
            return 0
        scaled = self.max_per_core * cpus
        return 1048576 if scaled > 1048576 else max(scaled, self.min)

    def sysctls(self) -> list[tuple[str, int]]:
        """The per-namespace sysctls to write, in upstream's order (unset ones left out)."""
        out = []
        for name, seconds in (
            ("nf_conntrack_tcp_timeout_established", self.tcp_established_timeout),
            ("nf_conntrack_tcp_timeout_close_wait", self.tcp_close_wait_timeout),
        ):
            if seconds > 0:
                out.append((name, int(seconds)))
        if self.tcp_be_liberal:
            out.append(("nf_conntrack_tcp_be_liberal", 1))
        for name, seconds in (
            ("nf_conntrack_udp_timeout", self.udp_timeout),
            ("nf_conntrack_udp_timeout_stream", self.udp_stream_timeout),
        ):
            if seconds > 0:
                out.append((name, int(seconds)))
        return [(f"net.netfilter.{n}", v) for n, v in out]


@dataclass(frozen=True)
class Source:
    """Where objects come from: a manifests directory, or an API server."""

    manifests: Path | None = None
    kubeconfig: str | None = None
    master: str | None = None


@dataclass(frozen=True)
class ProxyConfig:
    mode: str = ""
    """A registered mode's name (``pyproxy.backends.registry``; "": its default mode)."""
    node_name: str = "localhost"
    source: Source = field(default_factory=Source)
    cluster_cidrs: tuple[IPNetwork, ...] = ()
    detect_local_mode: DetectLocalMode = DetectLocalMode.CLUSTER_CIDR
    masquerade: Masquerade = field(default_factory=Masquerade)
    nodeport_addresses: NodePortAddresses = field(default_factory=NodePortAddresses)
    localhost_nodeports: bool = True
    min_sync_period: float = 1.0
    sync_period: float = 30.0
    iptables_backend: str = "auto"
    options: tuple[tuple[str, Any], ...] = ()
    """The settings modes declare for themselves (name, parsed value): a mode reads its own
    with ``option``; the configuration knows none of them."""
    metrics_address: tuple[str, int] | None = ("127.0.0.1", 10249)
    healthz_address: tuple[str, int] | None = ("0.0.0.0", 10256)
    service_metrics: bool = False
    """Per-service-port traffic metrics (and, in nftables mode, the named counters they read)."""
    service_metrics_max_series: int = 1000
    log_level: str = "info"
    log_format: str = "text"
    conntrack: Conntrack = field(default_factory=Conntrack)

    def option(self, name: str, default: Any = None) -> Any:
        """A mode's own setting, as parsed (``default`` when not given)."""
        return next((value for key, value in self.options if key == name), default)

    def with_options(self, **values: Any) -> ProxyConfig:
        """This configuration with some mode settings replaced (tests, tools)."""
        return replace(self, options=tuple({**dict(self.options), **values}.items()))

    def local_cidrs(self, node: NodeInfo, family: IPFamily) -> tuple[IPNetwork, ...]:
        """The CIDRs whose sources count as cluster-local traffic for ``family`` (none
        known: every source is treated as external and masqueraded where upstream would)."""
        if self.detect_local_mode is DetectLocalMode.NODE_CIDR:
            cidr = node.pod_cidr(family)
            return (cidr,) if cidr is not None else ()
        return tuple(c for c in self.cluster_cidrs if IPFamily.of(c) is family)
