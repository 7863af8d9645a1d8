"""Benchmark: the userspace relay against the same client talking to the pod directly.

Builds a namespace world, runs pyproxy --mode=userspace, and measures from the client
namespace: TCP requests per second (connect, read the greeting, close) and bulk throughput
(GEN of 200 MB), once through the ClusterIP (relayed) and once to the pod's IP (direct).
Prints a table and the ratios. Not a test. Usage: python -m tests.bench.userspace
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from tests.netns.services import HTTP, HTTP_EP, svc
from tests.netns.world import PYTHON, Pyproxy, World, can_run, manifest_objects, wait_for

CLIENT = r"""
import json, socket, sys, time
host, port, mode, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
t0 = time.monotonic()
if mode == "rps":
    for _ in range(n):
        with socket.create_connection((host, port), timeout=5) as s:
            s.makefile().readline()
    print(json.dumps({"value": n / (time.monotonic() - t0)}))
else:
    with socket.create_connection((host, port), timeout=30) as s:
        f = s.makefile("rwb"); f.readline(); f.write(b"GEN %d\n" % n); f.flush()
        got = 0
        while chunk := f.read1(1 << 20):
            got += len(chunk)
    print(json.dumps({"value": got / (time.monotonic() - t0) / 1e6}))
"""


def measure(world: World, host: str, port: int, mode: str, n: int) -> float:
    res = world.exec(
        world.client(0), PYTHON, "-c", CLIENT, host, str(port), mode, str(n), timeout=300
    )
    return float(json.loads(res.stdout)["value"])


def main() -> int:
    reason = can_run()
    if reason:
        print(f"benchmark: {reason}", file=sys.stderr)
        return 1
    world = World(f"b{os.getpid() % 1000}").build(pod_count=1, client_count=1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            proxy = Pyproxy(world, d, d / "log", mode="userspace")
            proxy.write(
                "bench",
                *manifest_objects(
                    world, svc("bench", "10.96.9.1", [HTTP]), world.pods[:1], HTTP_EP
                ),
            )
            proxy.start()
            wait_for(
                lambda: world.probe("tcp", "10.96.9.1", 80, timeout=1)["replies"],
                timeout=30,
                what="the relay",
            )
            rows = []
            for label, mode, n in (("requests/s", "rps", 2000), ("MB/s", "bulk", 200_000_000)):
                print(f"measuring {label} ...", flush=True)
                direct = max(measure(world, "10.244.1.2", 8080, mode, n) for _ in range(3))
                relayed = max(measure(world, "10.96.9.1", 80, mode, n) for _ in range(3))
                rows.append((label, direct, relayed))
            proxy.stop()
        print("\nuserspace relay vs direct (best of 3, one client, this machine):")
        for label, direct, relayed in rows:
            print(
                f"  {label:11} direct {direct:10.1f}   via pyproxy {relayed:10.1f}   "
                f"ratio {relayed / direct:5.2f}"
            )
    finally:
        world.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
