"""Garbage-collector settings for a process that holds a large, long-lived, acyclic state."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from typing import cast

GC_THRESHOLDS = (100_000, 50, 100)
"""Python's cyclic collector at its defaults (700, 10, 10) rescans every live object again and
again while a large cluster is listed and converted: at 10,000 services x 10 endpoints it
tripled the time to parse and track them here (2.6 s -> 1.1 s with these thresholds). The
proxy's state is acyclic, freed by reference counting; the collector only has stragglers to
find."""


def tune_gc() -> None:
    gc.set_threshold(*GC_THRESHOLDS)


def after_full_sync() -> None:
    """Move everything alive now out of the collector's sight (after a full sync: the state
    it built lives until the next one), and hand back to the kernel the memory the full sync
    used only while it ran."""
    gc.freeze()
    _trim()


def _libc_trim() -> Callable[[int], int] | None:
    try:
        return cast(Callable[[int], int], ctypes.CDLL(None).malloc_trim)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_MALLOC_TRIM = _libc_trim()


def _trim() -> None:
    """glibc keeps the heap a full sync grew (the whole table's text and its objects, tens of
    MB at 10,000 services) once it is freed, so every full sync left RSS about 50 MB higher
    at 10,000 services (the soak: 257 -> 306 MB after one forced full sync, and the same step
    at the hourly one). ``malloc_trim(0)`` returns the free pages: the same soak with it went
    back to 257 MB. MALLOC_ARENA_MAX=2, measured beside it, did not (297 MB)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
