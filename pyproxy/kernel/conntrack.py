"""Deleting conntrack entries, with the conntrack tool (Debian's ``conntrack`` package).

The tool exits non-zero when a filter matched nothing; that is success for us."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterable, Sequence

log = logging.getLogger(__name__)


def delete(filters: Iterable[Sequence[str]], ipv6: bool = False) -> int:
    """Run ``conntrack -D`` once per filter; returns how many entries were deleted."""
    tool = shutil.which("conntrack")
    if tool is None:
        log.warning("conntrack tool not found: stale UDP entries cannot be cleared")
        return 0
    total = 0
    for f in filters:
        cmd = [tool, "-D", "-f", "ipv6" if ipv6 else "ipv4", *f]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        for line in res.stderr.splitlines():
            if "flow entries have been deleted" in line:
                total += int(line.split()[-6]) if line.split()[-6].isdigit() else 0
        if res.returncode not in (0, 1):
            log.warning("%s: %s", " ".join(cmd), res.stderr.strip())
    return total
