"""Benchmark: the daemon's sync latency at scale, end to end (source -> tracker -> render ->
iptables-restore), against a target.

In a scratch node namespace: write N services x E endpoints as a manifests directory, start
pyproxy (iptables mode), time the first full sync; then change one service's endpoints and
time how long until that change is programmed (a partial sync), several times. Reads pyproxy's
own histograms from /metrics for the render/apply split. Prints a table and whether the
partial-sync target is met. Not a test.
Usage: python -m tests.bench.daemon_sync [--services 10000] [--endpoints 2] [--target 2.0]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from tests.netns.world import PYTHON, Pyproxy, World, can_run, wait_for

METRICS = r"""
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:10249/metrics", timeout=10).read().decode())
"""


def objects(n: int, e: int) -> list[dict]:
    out: list[dict] = []
    for i in range(n):
        name = f"s{i}"
        ip = f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}"
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "bench"},
                "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80}]},
            }
        )
        eps = [
            {
                "addresses": [
                    f"10.{128 + (i * e + j) // 65536}.{(i * e + j) // 256 % 256}."
                    f"{(i * e + j) % 256}"
                ],
                "conditions": {"ready": True},
            }
            for j in range(e)
        ]
        out.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-1",
                    "namespace": "bench",
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "endpoints": eps,
                "ports": [{"name": "http", "port": 8080}],
            }
        )
    return out


def metric_sum(text: str, name: str) -> float:
    return sum(
        float(m.group(1)) for m in re.finditer(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=2)
    ap.add_argument("--changes", type=int, default=5)
    ap.add_argument(
        "--target", type=float, default=2.0, help="partial-sync latency target in seconds"
    )
    args = ap.parse_args()
    if can_run():
        print(f"benchmark: {can_run()}", file=sys.stderr)
        return 1
    world = World(f"s{os.getpid() % 1000}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "m"
        d.mkdir()
        print(f"writing {args.services} services x {args.endpoints} endpoints ...", flush=True)
        (d / "bulk.json").write_text(
            json.dumps({"kind": "List", "items": objects(args.services, args.endpoints)})
        )
        try:
            world.build(pod_count=0, client_count=0)
            proxy = Pyproxy(
                world,
                d,
                Path(tmp) / "log",
                "--metrics-bind-address",
                "127.0.0.1:10249",
                "--sync-period",
                "1h",
            )
            t0 = time.monotonic()
            proxy.start()
            wait_for(
                lambda: "synced fully" in proxy.log.read_text(),
                timeout=900,
                interval=0.5,
                what="the first full sync",
            )
            first = time.monotonic() - t0
            print(f"  first full sync programmed after {first:.1f}s", flush=True)
            latencies = []
            for k in range(args.changes):
                before = proxy.syncs()
                doc = objects(1, args.endpoints + 1 + k)
                doc[0]["metadata"]["name"] = doc[1]["metadata"]["labels"][
                    "kubernetes.io/service-name"
                ] = f"extra{k}"
                doc[1]["metadata"]["name"] = f"extra{k}-1"
                doc[0]["spec"]["clusterIP"] = f"10.95.0.{k + 1}"
                t1 = time.monotonic()
                proxy.write(f"change{k}", *doc)
                wait_for(
                    lambda b=before: proxy.syncs() > b,
                    timeout=120,
                    interval=0.02,
                    what="the partial sync",
                )
                latencies.append(time.monotonic() - t1)
                print(f"  change {k + 1}: programmed after {latencies[-1]:.2f}s", flush=True)
            text = world.exec(world.node, PYTHON, "-c", METRICS).stdout
            proxy.stop()
        finally:
            world.close()

    def phase(name: str) -> float:
        m = re.search(rf'pyproxy_sync_phase_duration_seconds_sum\{{phase="{name}"\}} (\S+)', text)
        return float(m.group(1)) if m else 0.0

    render, apply_ = phase("render"), phase("apply")
    syncs = metric_sum(text, "kubeproxy_sync_proxy_rules_duration_seconds_count")
    best, worst = min(latencies), max(latencies)
    print(f"\n{args.services} services x {args.endpoints} endpoints, iptables mode, this machine:")
    print(f"  first full sync (incl. start-up and reading the manifests)  {first:8.2f}s")
    print(
        f"  one-service change -> programmed: best {best:.2f}s, worst {worst:.2f}s "
        f"(target {args.target:.2f}s: {'met' if worst <= args.target else 'NOT met'})"
    )
    print(f"  over {syncs:.0f} syncs: render {render:.2f}s, apply {apply_:.2f}s in total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
