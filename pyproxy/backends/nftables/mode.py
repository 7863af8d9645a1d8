"""nftables mode: upstream's table ``kube-proxy`` in families ip and ip6."""

from __future__ import annotations

from typing import Any

from pyproxy.backends.base import Backend
from pyproxy.backends.mode import Mode
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.nodeports import NodePortAddresses


def _create(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.nftables.backend import NftablesBackend

    return NftablesBackend(cfg)


def _counters(cfg: ProxyConfig) -> tuple[str, Any, str]:
    from pyproxy.backends.nftables.status import counters

    return counters()


MODE = Mode(
    "nftables",
    _create,
    masquerade_section="nftables",
    nodeport_default=NodePortAddresses(primary=True),  # upstream's default in this mode
    leftovers=("iptables", "ipvs"),
    counters=_counters,
)
