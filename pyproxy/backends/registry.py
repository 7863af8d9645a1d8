"""The modes there are: each declares itself in its folder's ``mode.py``; a new mode is a
folder and one line in ``MODES``. Tests may ``register`` a mode of their own."""

from __future__ import annotations

from pyproxy.backends.base import Backend, BackendUnavailable
from pyproxy.backends.ebpf.mode import MODE as EBPF
from pyproxy.backends.iptables.mode import MODE as IPTABLES
from pyproxy.backends.ipvs.mode import MODE as IPVS
from pyproxy.backends.mode import Mode
from pyproxy.backends.nftables.mode import MODE as NFTABLES
from pyproxy.backends.userspace.mode import MODE as USERSPACE
from pyproxy.config.settings import ProxyConfig

MODES: dict[str, Mode] = {m.name: m for m in (IPTABLES, IPVS, USERSPACE, NFTABLES, EBPF)}
DEFAULT = IPTABLES.name
"""Upstream's default mode on Linux."""


def register(mode: Mode) -> None:
    """Add a mode (a test's own; a mode of pyproxy's is a line in ``MODES``)."""
    MODES[mode.name] = mode


def modes() -> list[Mode]:
    return list(MODES.values())


def get(name: str) -> Mode:
    mode = MODES.get(name or DEFAULT)
    if mode is None:
        raise BackendUnavailable(f"unknown mode {name!r} (choose from {', '.join(MODES)})")
    return mode


def create(cfg: ProxyConfig) -> Backend:
    """The backend for ``cfg.mode``; BackendUnavailable (one line) for a mode there is not."""
    return get(cfg.mode).create(cfg)
