"""Mode name -> the factory that builds its backend from the configuration.

Factories import their backend lazily, so a mode's dependencies (pyroute2's IPVS, asyncio
relays) load only when that mode runs. A mode that is not built yet fails with one line.
"""

from __future__ import annotations

from collections.abc import Callable

from pyproxy.backends.base import Backend, BackendUnavailable
from pyproxy.config.settings import MODES, ProxyConfig


def _iptables(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.iptables.backend import IptablesBackend

    return IptablesBackend(cfg)


def _ipvs(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.ipvs.backend import IpvsBackend

    return IpvsBackend(cfg)


def _userspace(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.userspace.backend import UserspaceBackend

    return UserspaceBackend(cfg)


def _nftables(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.nftables.backend import NftablesBackend

    return NftablesBackend(cfg)


FACTORIES: dict[str, Callable[[ProxyConfig], Backend]] = {
    "iptables": _iptables,
    "ipvs": _ipvs,
    "userspace": _userspace,
    "nftables": _nftables,
}


def create(cfg: ProxyConfig) -> Backend:
    """The backend for ``cfg.mode``; BackendUnavailable (one line) for a mode not built."""
    factory = FACTORIES.get(cfg.mode)
    if factory is None:
        if cfg.mode in MODES:
            raise BackendUnavailable(
                f"--mode={cfg.mode} is not implemented yet (available: {', '.join(FACTORIES)})"
            )
        raise BackendUnavailable(f"unknown mode {cfg.mode!r} (choose from {', '.join(MODES)})")
    return factory(cfg)
