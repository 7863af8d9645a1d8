"""userspace mode: a relay per service port in pyproxy's own process."""

from __future__ import annotations

from pyproxy.backends.base import Backend
from pyproxy.backends.mode import Mode
from pyproxy.config.settings import ProxyConfig


def _create(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.userspace.backend import UserspaceBackend

    return UserspaceBackend(cfg)


# The relay's counts live in the daemon (its /debug/traffic): no kernel counters to read.
MODE = Mode("userspace", _create, sync_section="iptables")
