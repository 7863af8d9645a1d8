"""The kernel's own cost for a rule set: restoring it plainly (no --noflush, one
transaction) into an empty network namespace, which no proxy sharing the tables with other
programs can do, so no cold start can be faster."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from tests.bench.objects import endpoint_slice, service
from tests.helpers import cluster_ip
from tests.netns.world import PYPROXY, sh


def restore_plainly(text: str, mode: str = "iptables", wrap: tuple[str, ...] = ()) -> float:
    """Seconds to load ``text`` into a new empty namespace (``wrap``: a command the load runs
    under, such as ``perf record --``)."""
    ns = "ppbench-floor"
    sh("ip", "netns", "del", ns, check=False)  # left by an interrupted run
    sh("ip", "netns", "add", ns)
    loader = {"nftables": ["nft", "-f", "-"], "iptables-legacy": ["iptables-legacy-restore"]}.get(
        mode, ["iptables-nft-restore"]
    )
    try:
        t0 = time.monotonic()
        subprocess.run(
            [*wrap, "ip", "netns", "exec", ns, *loader],
            input=text, text=True, check=True, capture_output=True,
        )  # fmt: skip
        return time.monotonic() - t0
    finally:
        sh("ip", "netns", "del", ns, check=False)


def floor_of_namespace(ns: str, mode: str = "iptables") -> float:
    """The floor for the rules a proxy programmed in namespace ``ns``: its filter and nat
    tables (from the back end the mode uses), or (nftables mode) its ``ip kube-proxy``
    table, loaded in one ``nft -f``."""
    if mode == "nftables":
        table = sh("ip", "netns", "exec", ns, "nft", "list", "table", "ip", "kube-proxy",
                   timeout=300).stdout  # fmt: skip
        return restore_plainly(table, mode)
    save = "iptables-legacy-save" if mode == "iptables-legacy" else "iptables-nft-save"
    text = "".join(
        sh("ip", "netns", "exec", ns, save, "-t", table, timeout=300).stdout
        for table in ("filter", "nat")
    )
    return restore_plainly(text)


def render(n: int, m: int, mode: str = "iptables") -> tuple[str, float]:
    """``pyproxy render`` of N services x M endpoints from a manifests directory: the rules
    it prints (``mode``: iptables or nftables) and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="pyproxy-render-") as d:
        docs = []
        for i in range(n):
            svc = service(i)
            svc["spec"]["clusterIP"] = cluster_ip(i)
            docs += [svc, endpoint_slice(i, m)]
        Path(d, "objects.yaml").write_text(yaml.dump_all(docs, Dumper=yaml.CSafeDumper))
        t0 = time.monotonic()
        out = subprocess.run(
            [PYPROXY, "render", "--manifests", d, "--node", "node-a",
             "--cluster-cidr", "10.128.0.0/9", "--mode", mode],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return out, time.monotonic() - t0


def render_beside_floor(n: int, m: int) -> dict[str, float]:
    """``pyproxy render`` of N services x M endpoints, and the floor for the rules it prints."""
    out, render_s = render(n, m)
    return {"services": n, "endpoints": m, "render_s": render_s, "floor_s": restore_plainly(out)}
