"""nftables mode's cold start beside upstream's, taken apart (not in CI; a few minutes at
10,000 services):

1. Both proxies cold-start against one real API server holding N services x M endpoints,
   one after the other, ``--repeats`` times alternately; each row is the first sync's
   duration as the proxy's own ``kubeproxy_sync_proxy_rules_duration_seconds`` reports it.
2. Upstream's full-sync transaction is captured from its ``--v=9`` log (it logs every
   transaction it runs), pyproxy's is its ``render`` of the objects listed from the same
   API server, and both are timed with ``nft -f`` into an empty namespace, alternately: the
   kernel's and nft's cost of each transaction shape, apart from the proxies' own work.

Usage: python -m tests.bench.nft_cold_start [--services 10000] [--endpoints 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from tests.bench import objects
from tests.bench.proxies import Proxy
from tests.bench.side_by_side import CAP, progress, wait
from tests.cluster.cluster import Cluster
from tests.netns.world import PYPROXY, sh

DURATION = "kubeproxy_sync_proxy_rules_duration_seconds"


def first_sync(p: Proxy) -> float:
    """Start ``p``, wait for its first sync; that sync's duration (its own histogram)."""
    p.start()
    text = wait(p, lambda t: p.value(t, f"{DURATION}_count") > 0, CAP, "the first sync")
    return p.value(text, f"{DURATION}_sum") / p.value(text, f"{DURATION}_count")


def upstream_transaction(p: Proxy) -> str:
    """The largest transaction upstream logged (klog prints a multi-line value as
    ``transaction=<`` then the lines indented by a tab, then `` >``)."""
    text = p.log.read_text(errors="replace")
    best = ""
    for m in re.finditer(r'"Running nftables transaction" transaction=<\n(.*?)\n >', text, re.S):
        body = "\n".join(line[1:] for line in m.group(1).splitlines()) + "\n"
        if len(body) > len(best):
            best = body
    return best


def pyproxy_transaction(cluster: Cluster, work: Path) -> str:
    """pyproxy's full-sync transaction for the objects the API server holds."""
    docs = []
    for path in (objects.SERVICES, objects.SLICES):
        items = cluster.ok("GET", path)["items"]
        kind = "Service" if path == objects.SERVICES else "EndpointSlice"
        docs += [{"apiVersion": "v1", "kind": kind, **item} for item in items]
    d = work / "listed"
    d.mkdir(exist_ok=True)
    (d / "objects.yaml").write_text(yaml.dump_all(docs, Dumper=yaml.CSafeDumper))
    out = subprocess.run([PYPROXY, "render", "--mode=nftables", "--manifests", str(d),
                          "--node", "node-a", "--cluster-cidr", "10.128.0.0/9"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return "".join(line + "\n" for line in out.splitlines() if not line.startswith("#"))


def nft_load(text: str) -> float:
    ns = "ppbench-nftload"
    sh("ip", "netns", "del", ns, check=False)
    sh("ip", "netns", "add", ns)
    try:
        t0 = time.monotonic()
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=text, text=True,
                       check=True, capture_output=True)  # fmt: skip
        return time.monotonic() - t0
    finally:
        sh("ip", "netns", "del", ns, check=False)


def shape(text: str) -> str:
    counts: dict[str, int] = {}
    for line in text.splitlines():
        words = line.split(" ", 2)
        if len(words) > 1:
            key = f"{words[0]} {words[1]}"
            counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pyproxy-coldstart-"))
    cluster = Cluster(work / "control-plane").start()
    try:
        from tests.e2e.kube import Kube

        root = Path(__file__).resolve().parents[2]
        kube = Kube(cluster)
        kube.apply_files(
            root / "deploy" / "base" / "serviceaccount.yaml", root / "deploy" / "base" / "rbac.yaml"
        )
        kube.node("node-a")
        kube.patch_status("/api/v1/nodes/node-a", {"addresses": [
            {"type": "InternalIP", "address": "172.30.0.11"}]})  # fmt: skip
        progress(f"creating {args.services} services x {args.endpoints} endpoints ...")
        objects.grow(cluster, 0, args.services, args.endpoints, progress)
        for r in range(args.repeats):
            for name in ("kube-proxy", "pyproxy"):
                p = Proxy(name, "nftables", cluster, work)
                try:
                    progress(f"round {r + 1}: {name} first sync {first_sync(p):.2f} s")
                finally:
                    p.stop()
        p = Proxy("kube-proxy", "nftables", cluster, work)
        plain = p.command
        p.command = lambda config: [*plain(config)[:-1], "--v=9"]  # type: ignore[method-assign]
        try:
            progress(f"kube-proxy --v=9 (capturing its transaction): first sync "
                     f"{first_sync(p):.2f} s")  # fmt: skip
            theirs = upstream_transaction(p)
        finally:
            p.stop()
        ours = pyproxy_transaction(cluster, work)
        for who, text in (("upstream", theirs), ("pyproxy", ours)):
            (work.parent / f"coldstart-{who}.nft").write_text(text)
            progress(f"{who}: {len(text.splitlines())} lines ({shape(text)})")
        for r in range(args.repeats):
            for who, text in (("upstream", theirs), ("pyproxy", ours)):
                progress(f"round {r + 1}: nft -f of {who}'s transaction {nft_load(text):.2f} s")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
