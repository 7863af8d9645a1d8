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


HASHSIZE = Path("/sys/module/nf_conntrack/parameters/hashsize")


def ensure_conntrack_max(size: int) -> str:
    """nf_conntrack_max at ``size``, and conntrack's hash table at a quarter of it where it is
    smaller, as upstream's SetMax; returns why not ("" when set). Only the machine's first
    network namespace may write the size: elsewhere the kernel refuses it."""
    why = ensure("net.netfilter.nf_conntrack_max", str(size))
    if why:
        return why
    try:
        buckets = int(HASHSIZE.read_text())
    except (OSError, ValueError) as err:
        return f"cannot read {HASHSIZE}: {err}"
    if buckets >= size // 4:
        return ""
    try:
        HASHSIZE.write_text(str(size // 4))
    except OSError as err:
        return f"cannot set {HASHSIZE} to {size // 4}: {err.strerror or err}"
    log.info("set conntrack hashsize %d", size // 4)
    return ""
