"""Logging set-up: text or JSON lines on stderr, with klog-style ``--v`` mapped onto levels."""

from __future__ import annotations

import json
import logging
import sys

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": self.formatTime(record),
                "level": record.levelname.lower(),
                "logger": record.name,
                "msg": record.getMessage(),
            }
        )


def setup_logging(level: str, fmt: str, verbosity: int | None) -> None:
    lvl = LEVELS[level]
    if verbosity is not None and verbosity >= 4:
        lvl = logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    # Libraries stay at INFO: pyroute2's debug output is every netlink message, which buries
    # pyproxy's own debug lines.
    for name in ("pyroute2", "urllib3", "kubernetes", "watchdog"):
        logging.getLogger(name).setLevel(max(lvl, logging.INFO))
