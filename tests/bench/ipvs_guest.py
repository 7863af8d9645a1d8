"""Benchmark, inside the user-mode Linux guest: pyproxy --mode=ipvs with default flags (the
iptables back end auto-detected; an idle periodic resync logs nothing at INFO, so it is never
counted as a change's sync), N services x 10 endpoints from a manifests directory, in a
network namespace of the guest. For each N: the first full
sync, then five one-endpoint changes (the sync that programs each, from the daemon's log),
RSS. Run through ``python -m tests.bench.ipvs_uml``; not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.bench.objects import endpoint_slice, service
from tests.netns.world import PYPROXY

NS = "ppbench-ipvs"
PER_FILE = 100


def progress(msg: str) -> None:
    print(f"[ipvs {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_file(d: Path, k: int, n: int, changed: dict[int, int]) -> None:
    docs = []
    for i in range(k * PER_FILE, min(n, (k + 1) * PER_FILE)):
        svc = service(i)
        svc["spec"]["clusterIP"] = f"10.96.{i // 256}.{i % 256}"
        docs += [svc, endpoint_slice(i, 10, changed.get(i, 0))]
    (d / f"svc-{k:04d}.yaml").write_text(yaml.dump_all(docs, Dumper=yaml.CSafeDumper))


def synced(log: Path, how: str) -> list[float]:
    return [float(x) for x in re.findall(rf"synced {how} in ([0-9.]+)s", log.read_text())]


def wait(cond, what: str, cap: float = 1800.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + cap
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {cap:.0f}s")
        time.sleep(0.2)


def measure(n: int) -> dict[str, float]:
    subprocess.run(["ip", "netns", "add", NS], check=True)
    subprocess.run(["ip", "-n", NS, "link", "set", "lo", "up"], check=True)
    d = Path(tempfile.mkdtemp(prefix="ipvs-bench-"))
    log = d / "pyproxy.log"
    address = {"type": "InternalIP", "address": "172.30.0.11"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
            "status": {"addresses": [address]}}  # fmt: skip
    man = d / "m"
    man.mkdir()
    (man / "node.yaml").write_text(yaml.safe_dump(node))
    for k in range((n + PER_FILE - 1) // PER_FILE):
        write_file(man, k, n, {})
    proc = subprocess.Popen(
        ["ip", "netns", "exec", NS, PYPROXY, "--mode=ipvs", "--manifests", str(man),
         "--hostname-override", "node-a", "--cluster-cidr", "10.128.0.0/9",
         "--conntrack-max-per-core=0"],
        stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        t0 = time.monotonic()
        wait(lambda: synced(log, "fully"), "the first full sync")
        cold = time.monotonic() - t0
        progress(
            f"N = {n}: first full sync {synced(log, 'fully')[0]:.2f}s ({cold:.1f}s from start)"
        )
        partials = []
        for g in range(1, 6):
            before = len(synced(log, "partially"))
            write_file(man, 0, n, {7: g})
            wait(lambda b=before: len(synced(log, "partially")) > b, "a partial sync")
            partials.append(synced(log, "partially")[-1])
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
        row = {"services": n, "full_sync_s": synced(log, "fully")[0],
               "partial_sync_p50_s": statistics.median(partials), "rss_mb": rss,
               "full_syncs": len(synced(log, "fully"))}  # fmt: skip
        progress(f"N = {n}: one change {row['partial_sync_p50_s'] * 1000:.1f} ms, RSS {rss:.0f} MB")
        return row
    finally:
        proc.terminate()
        proc.wait(30)
        subprocess.run(["ip", "netns", "del", NS], check=False)  # takes IPVS and kube-ipvs0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,5000")
    args = ap.parse_args()
    rows = [measure(int(n)) for n in args.sizes.split(",")]
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
