#!/usr/bin/env python3
"""Stands in for ``iptables-*-restore`` on PATH (tests/netns/test_faults.py). Normally it
runs the real tool with the same input. While the file named by ``PYPROXY_TEST_KILL_RESTORE``
exists, it removes that file, feeds the real tool half of the transaction, then kills the
tool and itself with SIGKILL: the restore tool killed mid-transaction."""

import os
import signal
import subprocess
import sys
import time

real = os.path.join("/usr/sbin", os.path.basename(sys.argv[0]))
data = sys.stdin.buffer.read()
trigger = os.environ.get("PYPROXY_TEST_KILL_RESTORE", "")
try:
    os.unlink(trigger)
except OSError:
    res = subprocess.run([real, *sys.argv[1:]], input=data, capture_output=True, timeout=300)
    sys.stdout.buffer.write(res.stdout)
    sys.stderr.buffer.write(res.stderr)
    sys.exit(res.returncode)
tool = subprocess.Popen([real, *sys.argv[1:]], stdin=subprocess.PIPE)
assert tool.stdin is not None
tool.stdin.write(data[: len(data) // 2])
tool.stdin.flush()
time.sleep(0.2)
tool.kill()
tool.wait(10)
with open(trigger + ".done", "w") as f:
    f.write(f"killed {os.path.basename(real)} after {len(data) // 2} of {len(data)} bytes\n")
os.kill(os.getpid(), signal.SIGKILL)
