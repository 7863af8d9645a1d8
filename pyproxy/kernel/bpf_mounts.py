"""Where BPF objects live on this host: the cgroup v2 hierarchy socket programs attach to, and
the bpffs that pins keep programs, links and maps in after the process ends."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _mounts() -> list[tuple[str, str]]:
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3:
            out.append((fields[1].replace("\\040", " "), fields[2]))
    return out


def _under(path: str, where: str) -> bool:
    return path == where or path.startswith(where.rstrip("/") + "/")


def cgroup2_root() -> str | None:
    """The first cgroup v2 mount (its root is the host's root cgroup), or None."""
    return next((where for where, kind in _mounts() if kind == "cgroup2"), None)


def is_cgroup2(path: str) -> bool:
    """Whether ``path`` is a directory of a cgroup v2 hierarchy."""
    return os.path.isfile(os.path.join(path, "cgroup.procs")) and any(
        kind == "cgroup2" and _under(path, where) for where, kind in _mounts()
    )


def bpffs_of(path: str) -> str | None:
    """The bpffs mount ``path`` lies in, or None."""
    found = [where for where, kind in _mounts() if kind == "bpf" and _under(path, where)]
    return max(found, key=len) if found else None


def mount_bpffs(where: str) -> None:
    """Mount a bpffs at ``where`` (the host's /sys/fs/bpf when none is mounted there)."""
    os.makedirs(where, exist_ok=True)
    res = subprocess.run(["mount", "-t", "bpf", "bpf", where], capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    if res.returncode != 0:
        raise OSError(f"cannot mount a bpffs at {where}: {res.stderr.strip()}")
