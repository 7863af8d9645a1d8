"""Run netfilter tools in a throwaway network namespace: the kernel's own spelling of a rule
set. ``pyproxy diff`` loads what pyproxy would program there and lists it back, so both sides
of the comparison are printed by the same tool from the same kernel (``-m tcp -p tcp -d
10.96.0.10`` in, ``-d 10.96.0.10/32 -p tcp -m tcp`` out) without pyproxy reimplementing that
normalization. Needs CAP_SYS_ADMIN (root); the namespace dies with the child process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

CHILD = r"""
import ctypes, json, subprocess, sys
CLONE_NEWNET = 0x40000000
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(CLONE_NEWNET) != 0:
    print(json.dumps({"error": "unshare(CLONE_NEWNET): errno %d" % ctypes.get_errno()}))
    sys.exit(0)
out = []
for argv, stdin in json.load(sys.stdin):
    try:
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=600)
    except OSError as e:
        print(json.dumps({"error": "%s: %s" % (argv[0], e)}))
        sys.exit(0)
    if r.returncode != 0:
        print(json.dumps({"error": "%s: %s" % (" ".join(argv), r.stderr.strip()[-500:])}))
        sys.exit(0)
    out.append(r.stdout)
print(json.dumps({"out": out}))
"""


class ScratchError(RuntimeError):
    pass


def run_in_scratch(steps: Sequence[tuple[Sequence[str], str | None]]) -> list[str]:
    """Run each (argv, stdin) in order in one new, empty network namespace; their stdouts.
    Raises ScratchError naming the step that failed."""
    payload = json.dumps([[list(argv), stdin] for argv, stdin in steps])
    res = subprocess.run(
        [sys.executable, "-c", CHILD], input=payload, capture_output=True, text=True, timeout=900
    )
    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError:
        raise ScratchError(f"scratch namespace: {res.stderr.strip()[-300:]}") from None
    if "error" in doc:
        raise ScratchError(f"in a scratch namespace: {doc['error']}")
    return [str(o) for o in doc["out"]]
