"""iptables mode, as upstream's default."""

from __future__ import annotations

from typing import Any

from pyproxy.backends.base import Backend
from pyproxy.backends.mode import Mode
from pyproxy.config.settings import ProxyConfig


def _create(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.iptables.backend import IptablesBackend

    return IptablesBackend(cfg)


def _counters(cfg: ProxyConfig) -> tuple[str, Any, str]:
    from pyproxy.backends.iptables.status import counters

    return counters(cfg.iptables_backend)


MODE = Mode("iptables", _create, leftovers=("nftables",), counters=_counters)
