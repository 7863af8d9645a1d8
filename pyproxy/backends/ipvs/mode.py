"""IPVS mode: virtual servers, ipsets and a few iptables rules."""

from __future__ import annotations

from typing import Any

from pyproxy.backends.base import Backend
from pyproxy.backends.mode import Mode
from pyproxy.config.load import Setting, boolean, choice
from pyproxy.config.settings import ProxyConfig

SCHEDULERS = ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh")


def _create(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.ipvs.backend import IpvsBackend

    return IpvsBackend(cfg)


def _counters(cfg: ProxyConfig) -> tuple[str, Any, str]:
    from pyproxy.backends.ipvs.status import counters

    return counters()


MODE = Mode(
    "ipvs",
    _create,
    settings=(
        Setting(
            "ipvs_scheduler",
            "--ipvs-scheduler",
            "ipvs.scheduler",
            "rr",
            choice(*SCHEDULERS),
            "IPVS scheduler.",
            SCHEDULERS,
        ),
        Setting(
            "ipvs_strict_arp",
            "--ipvs-strict-arp",
            "ipvs.strictARP",
            False,
            boolean,
            "Set arp_ignore=1 and arp_announce=2 (ipvs mode).",
        ),
    ),
    leftovers=("nftables",),
    counters=_counters,
)
