"""Mode name -> backend. A mode that is not built yet fails with a clear one-line error."""

from __future__ import annotations

from typing import Any

from pyproxy.backends.base import Backend, BackendUnavailable

MODES = ("iptables", "ipvs", "userspace", "nftables")
BUILT = ("iptables", "ipvs", "userspace")


def create(mode: str, options: dict[str, Any]) -> Backend:
    """Build the backend for ``mode`` from mode-independent options (unused ones ignored)."""
    if mode == "iptables":
        from pyproxy.backends.iptables.backend import IptablesBackend, IptablesOptions

        known = IptablesOptions.__dataclass_fields__
        return IptablesBackend(IptablesOptions(**{k: v for k, v in options.items() if k in known}))
    if mode == "ipvs":
        from pyproxy.backends.ipvs.backend import IpvsBackend, IpvsOptions

        known = IpvsOptions.__dataclass_fields__
        return IpvsBackend(IpvsOptions(**{k: v for k, v in options.items() if k in known}))
    if mode == "userspace":
        from pyproxy.backends.userspace.backend import UserspaceBackend

        return UserspaceBackend(iptables_backend=str(options.get("iptables_backend", "auto")))
    if mode in MODES:
        raise BackendUnavailable(
            f"--mode={mode} is not implemented yet (available: {', '.join(BUILT)})"
        )
    raise BackendUnavailable(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
