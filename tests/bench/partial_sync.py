"""Benchmark: what one partial sync costs on a large table, pyproxy's delta vs upstream's.

In a scratch network namespace, load N services (E endpoints each) with a full sync, then
time three ways of adding one service:
  full      - a full sync (every chain rewritten)
  upstream  - upstream's partial sync: KUBE-SERVICES/KUBE-NODEPORTS (and the filter table)
              redeclared and rewritten in full, plus the new service's chains
  pyproxy   - pyproxy's partial sync: the new service's chains plus one inserted line
Prints progress and a table; the figures go into README. Not a test: no pass/fail.
Usage: python -m tests.bench.partial_sync [--services N] [--endpoints E] [--backend nft|legacy]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import subprocess
import sys
import time

from pyproxy.backends.iptables.backend import partial_text
from pyproxy.backends.iptables.render import FILTER_TOP, NAT_TOP, IptablesConfig, Rendered, render
from pyproxy.model.types import (
    Endpoint,
    NamespacedName,
    NodeInfo,
    Protocol,
    ProxyState,
    ServicePort,
    ServicePortName,
)


def state(n: int, e: int) -> ProxyState:
    services = {}
    endpoints = {}
    for i in range(n):
        spn = ServicePortName(NamespacedName("bench", f"svc-{i}"), "http", Protocol.TCP)
        services[spn] = ServicePort(
            spn,
            (ipaddress.ip_address(f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}"),),
            80,
            node_port=30000 + i % 2000 if i < 2000 else 0,
        )
        endpoints[spn] = tuple(
            Endpoint(
                ipaddress.ip_address(
                    f"10.{128 + (i * e + j) // 65536}."
                    f"{(i * e + j) // 256 % 256}.{(i * e + j) % 256}"
                ),
                8080,
            )
            for j in range(e)
        )
    return ProxyState(services, endpoints, NodeInfo("node-a"))


def upstream_partial(old: Rendered, new: Rendered, changed: set[NamespacedName]) -> str:
    """Upstream's shape: top-level chains redeclared in full, changed services' chains."""
    out = ["*filter"] + [f":{c} - [0:0]" for c in new.filter_chain_names()]
    for c in new.filter_chain_names():
        out += new.filter_top.get(c, [])
    out += ["COMMIT", "*nat"] + [f":{c} - [0:0]" for c in NAT_TOP]
    rules = []
    for svc in changed:
        for chain, lines in new.services[svc].chains.items():
            out.append(f":{chain} - [0:0]")
            rules += lines
    for c in NAT_TOP:
        out += new.nat_top.get(c, [])
    return "\n".join(out + rules + ["COMMIT"]) + "\n"


def restore(ns: str, backend: str, text: str) -> float:
    t0 = time.monotonic()
    subprocess.run(
        ["ip", "netns", "exec", ns, f"iptables-{backend}-restore", "--noflush"],
        input=text,
        text=True,
        check=True,
        capture_output=True,
    )
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=2)
    ap.add_argument("--backend", default="nft", choices=["nft", "legacy"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (it works in a scratch network namespace)", file=sys.stderr)
        return 1
    cfg = IptablesConfig(cluster_cidrs=(ipaddress.ip_network("10.128.0.0/9"),))
    print(f"rendering {args.services} services x {args.endpoints} endpoints ...", flush=True)
    t0 = time.monotonic()
    base_state = state(args.services, args.endpoints)
    base = render(base_state, cfg)
    print(
        f"  render: {time.monotonic() - t0:.2f}s, {sum(base.rule_counts().values())} rules",
        flush=True,
    )
    ns = f"ppbench{os.getpid() % 10000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        print(f"full load into {args.backend} (namespace {ns}) ...", flush=True)
        full_s = restore(ns, args.backend, base.text())
        print(f"  full sync: {full_s:.2f}s", flush=True)
        results: dict[str, list[float]] = {"upstream": [], "pyproxy": []}
        for k in range(args.repeat):
            extra = state(args.services + 1, args.endpoints)
            new = render(extra, cfg)
            key = NamespacedName("bench", f"svc-{args.services}")
            for name, text in (
                ("upstream", upstream_partial(base, new, {key})),
                ("pyproxy", partial_text(base, new, {key})),
            ):
                took = restore(ns, args.backend, text)
                results[name].append(took)
                # put the table back to the base state for the next measurement
                restore(ns, args.backend, partial_text(new, base, {key}))
                print(
                    f"  round {k + 1}: {name:8} {took:.3f}s ({len(text.splitlines())} lines)",
                    flush=True,
                )
        print(
            f"\n{args.backend}, {args.services} services x {args.endpoints} endpoints "
            f"({sum(base.rule_counts().values())} rules), add one service:"
        )
        print(f"  full sync            {full_s:8.3f}s")
        for name, xs in results.items():
            print(f"  {name:8} partial     {min(xs):8.3f}s (best of {len(xs)})")
        ratio = min(results["upstream"]) / max(min(results["pyproxy"]), 1e-6)
        print(f"  upstream / pyproxy   {ratio:8.1f}x")
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    _ = FILTER_TOP
    return 0


if __name__ == "__main__":
    sys.exit(main())
