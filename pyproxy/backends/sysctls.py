"""Sysctls a mode needs, set at start or the start ends: shared by the iptables and IPVS
modes."""

from __future__ import annotations

from collections.abc import Sequence

from pyproxy.backends.base import BackendUnavailable
from pyproxy.kernel import sysctl


def require_sysctls(settings: Sequence[tuple[str, str]], needed_by: str, instead: str = "") -> None:
    """Set each sysctl or end the start with one line, as upstream's proxiers do: a container
    whose /proc/sys is read-only (not privileged) cannot write them, and no retry changes that.
    ``instead`` names the flag that makes the setting unnecessary."""
    for name, value in settings:
        why = sysctl.ensure(name, value)
        if why:
            hint = "run privileged, or set it on the host first"
            raise BackendUnavailable(
                f"{why} (needed by {needed_by}; {hint}{', or ' + instead if instead else ''})"
            )
