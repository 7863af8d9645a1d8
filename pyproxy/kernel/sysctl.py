"""Reading and writing sysctls under /proc/sys (per network namespace where they are)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def _path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def get(name: str) -> str | None:
    try:
        return _path(name).read_text().strip()
    except OSError:
        return None


def ensure(name: str, value: str) -> str:
    """Set ``name`` to ``value`` if needed; returns why it could not be set ("" when set)."""
    if get(name) == value:
        return ""
    try:
        _path(name).write_text(value)
    except OSError as err:
        return f"cannot set sysctl {name}={value}: {err.strerror or err}"
    log.info("set sysctl %s=%s", name, value)
    return ""
