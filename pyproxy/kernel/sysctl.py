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


def ensure(name: str, value: str) -> bool:
    """Set ``name`` to ``value`` if needed; False (and a log line) if it cannot be set."""
    if get(name) == value:
        return True
    try:
        _path(name).write_text(value)
    except OSError as err:
        log.error("cannot set sysctl %s=%s: %s", name, value, err)
        return False
    log.info("set sysctl %s=%s", name, value)
    return True
