"""Benchmark: what loading iptables rules costs the kernel and its tools, pyproxy's way and
upstream's way, in a scratch network namespace (nothing else is touched).

For N services with E endpoints each, rendered by pyproxy:
  floor            - one plain iptables-restore of everything into an empty namespace (no
                     --noflush: the kernel's own cost, which a proxy sharing the tables with
                     other programs cannot use)
  one transaction  - a full sync as one --noflush transaction (upstream's cold start)
  batched          - a full sync as pyproxy's ordered --noflush transactions
  upstream partial - adding one service as upstream does (top-level chains rewritten in full)
  pyproxy partial  - adding one service as pyproxy does (its chains plus -I of its lines)
  one rule added   - appending a single rule to an empty chain: on nf_tables the kernel then
                     re-validates every chain reachable from the built-in ones (kernel time,
                     growing with the table), so no partial sync that adds a rule is cheaper
The partials run with the built-in chains jumping to KUBE-SERVICES and KUBE-POSTROUTING, as
on a node: without those jumps nothing is reachable and the validation costs nothing.
Prints progress and a table. Not a test: no pass/fail.
Usage: python -m tests.bench.kernel_load [--services N] [--endpoints E] [--backend nft|legacy]
       [--partials-only]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyproxy.backends.iptables.backend import BATCH_LINES
from pyproxy.backends.iptables.endpoint_chain import lines
from pyproxy.backends.iptables.render import IptablesConfig
from pyproxy.backends.iptables.table import Rendered, Renderer, partial_restore
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.types import NamespacedName
from tests.bench.synthetic import state


def upstream_partial(new: Rendered, changed: NamespacedName) -> str:
    """Upstream's shape: top-level chains redeclared and rewritten in full, plus the changed
    service's own chains."""
    out = ["*filter"]
    filt, nat = new.top("filter"), new.top("nat")
    out += [f":{c} - [0:0]" for c in filt] + [line for rules in filt.values()
                                              for line in lines(rules)]  # fmt: skip
    out += ["COMMIT", "*nat"] + [f":{c} - [0:0]" for c in nat]
    own = new.entries[changed].objects.chains
    out += [f":{c} - [0:0]" for c in own] + [line for rules in nat.values()
                                             for line in lines(rules)]  # fmt: skip
    out += [line for rules in own.values() for line in lines(rules)]
    return "\n".join([*out, "COMMIT"]) + "\n"


JUMPS = """*nat
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
COMMIT
"""


CAP = 15 * 60.0
"""A load not done within 15 minutes is reported as such (upstream's one transaction at
10,000 services)."""


def restore(ns: str, backend: str, text: str, noflush: bool = True) -> float:
    t0 = time.monotonic()
    try:
        subprocess.run(
            ["ip", "netns", "exec", ns, f"iptables-{backend}-restore"]
            + (["--noflush"] if noflush else []),
            input=text,
            text=True,
            check=True,
            capture_output=True,
            timeout=CAP,
        )
    except subprocess.TimeoutExpired:
        return float("inf")
    return time.monotonic() - t0


@contextmanager
def scratch() -> Iterator[str]:
    ns = f"ppbench{os.getpid() % 10000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def measure_loads(base: Rendered, backend: str) -> dict[str, float]:
    out = {}
    with scratch() as ns:
        out["floor"] = restore(ns, backend, base.text(), noflush=False)
    print(f"  floor (plain restore): {out['floor']:.2f}s", flush=True)
    with scratch() as ns:
        out["one transaction"] = restore(ns, backend, base.text())
    print(f"  one --noflush transaction: {out['one transaction']:.2f}s", flush=True)
    batches = base.batches(max_lines=BATCH_LINES if backend == "nft" else None)
    with scratch() as ns:
        t0 = time.monotonic()
        for text in batches:
            restore(ns, backend, text)
        out["batched"] = time.monotonic() - t0
    print(f"  pyproxy's loader ({len(batches)} transactions): {out['batched']:.2f}s", flush=True)
    return out


def measure_partials(
    renderer: Renderer, base: Rendered, n: int, e: int, backend: str, repeat: int
) -> dict[str, float]:
    key = NamespacedName("bench", f"svc-{n}")
    bigger = state(n + 1, e)
    best = {n: float("inf") for n in ("upstream partial", "pyproxy partial", "one rule added")}
    with scratch() as ns:
        for text in base.batches(max_lines=BATCH_LINES if backend == "nft" else None):
            restore(ns, backend, text)
        restore(ns, backend, JUMPS)
        for _ in range(repeat):
            took = restore(ns, backend, "*nat\n-N KUBE-BENCH\n-A KUBE-BENCH -j RETURN\nCOMMIT\n")
            restore(ns, backend, "*nat\n-F KUBE-BENCH\n-X KUBE-BENCH\nCOMMIT\n")
            best["one rule added"] = min(best["one rule added"], took)
            print(f"  one rule added: {took:.3f}s", flush=True)
            add = renderer.updates(bigger, {key}, base)
            assert add is not None
            new_entry = add[key]
            assert new_entry is not None
            full = Rendered(
                base.cfg, base.facts, base.static_filter, base.static_nat, base.tail,
                {**base.entries, key: new_entry},
            )  # fmt: skip
            for name, text in (
                ("upstream partial", upstream_partial(full, key)),
                ("pyproxy partial", partial_restore(base, add).text),
            ):
                took = restore(ns, backend, text)
                best[name] = min(best[name], took)
                restore(ns, backend, partial_restore(full, {key: None}).text)  # back to the base
                print(f"  {name}: {took:.3f}s ({len(text.splitlines())} lines)", flush=True)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--backend", default="nft", choices=["nft", "legacy"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--partials-only",
        action="store_true",
        help="skip the cold loads (upstream's one transaction is > 15 min at 10,000)",
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (it works in scratch network namespaces)", file=sys.stderr)
        return 1
    cfg = IptablesConfig(proxy=ProxyConfig(cluster_cidrs=(ipaddress.ip_network("10.128.0.0/9"),)))
    n, e = args.services, args.endpoints
    print(f"rendering {n} services x {e} endpoints ...", flush=True)
    t0 = time.monotonic()
    renderer = Renderer(cfg)
    base = renderer.render(state(n, e))
    rules = sum(base.counts.values())
    print(f"  render: {time.monotonic() - t0:.2f}s, {rules} rules", flush=True)
    results = {} if args.partials_only else measure_loads(base, args.backend)
    results |= measure_partials(renderer, base, n, e, args.backend, args.repeat)
    print(f"\n{args.backend}, {n} services x {e} endpoints ({rules} rules):")
    for name, seconds in results.items():
        print(f"  {name:18} " + (f"{seconds:8.3f}s" if seconds < CAP else "  > 15 min"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
