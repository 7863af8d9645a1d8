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
