"""Run a command from an image's root filesystem as a container runtime runs a pod container
that is not privileged and has ``readOnlyRootFilesystem``: the root read-only, /proc with
/proc/sys read-only, /sys read-only, /dev, fresh tmpfs on /tmp and /run, host paths bound in,
and the capability bounding set cut to the given capabilities with no_new_privs, so the command
holds those capabilities and no other.

Usage (from the node namespace, in a private mount namespace):
    ip netns exec NODE unshare --mount --propagation private \
        python3 confined.py ROOT [--cap NAME]... [--bind SRC:DST]... -- COMMAND...
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
from pathlib import Path

CAPS = {"NET_ADMIN": 12, "NET_RAW": 13, "NET_BIND_SERVICE": 10, "SYS_MODULE": 16,
        "SYS_ADMIN": 21, "PERFMON": 38, "BPF": 39}  # fmt: skip
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--cap", action="append", default=[], choices=sorted(CAPS))
    ap.add_argument("--bind", action="append", default=[])
    ap.add_argument("command", nargs="+")
    a = ap.parse_args()

    new = a.root  # bound onto itself: the read-only view lives in this mount namespace only
    mount("--bind", a.root, new)
    binds = [spec.split(":", 1) for spec in a.bind]
    for src, dst in binds:  # mount points, made (as a runtime does) before the root turns ro
        target = Path(new + dst)
        if Path(src).is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
    mount("-o", "remount,bind,ro", new)
    mount("-t", "proc", "proc", f"{new}/proc")
    mount("--bind", f"{new}/proc/sys", f"{new}/proc/sys")
    mount("-o", "remount,bind,ro", f"{new}/proc/sys")
    mount("--rbind", "/sys", f"{new}/sys")
    mount("-o", "remount,bind,ro", f"{new}/sys")
    mount("--rbind", "/dev", f"{new}/dev")
    for src, dst in binds:
        mount("--bind", src, new + dst)

    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    keep = {CAPS[c] for c in a.cap}
    os.chroot(new)
    os.chdir("/")
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(last + 1):
        if cap not in keep and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    os.execv(a.command[0], a.command)


if __name__ == "__main__":
    main()
