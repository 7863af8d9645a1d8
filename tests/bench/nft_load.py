"""How the kernel's load of nftables mode's rules grows with the services: ``pyproxy
render --mode nftables`` of N services x 10 endpoints, loaded plainly (one ``nft -f`` into an
empty namespace) for each N. The load grows with the square of N; ``perf record -e cpu-clock
-g`` of a load shows why (``--perf``: the hottest kernel symbols, at the largest N).
Not in CI; prints progress and a table.
Usage: python -m tests.bench.nft_load [--sizes 5000,10000,20000] [--perf]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from tests.bench.kernel_floor import render, restore_plainly
from tests.bench.report import machine
from tests.bench.side_by_side import progress


def perf_top(rules: str) -> str:
    """The kernel symbols a plain load of ``rules`` spends its time in (perf, cpu-clock)."""
    with tempfile.TemporaryDirectory(prefix="pyproxy-perf-") as d:
        data = f"{d}/perf.data"
        restore_plainly(rules, "nftables", ("perf", "record", "-q", "-e", "cpu-clock", "-o", data,
                                            "--"))  # fmt: skip
        report = subprocess.run(
            ["perf", "report", "-i", data, "--stdio", "--no-children",
             "--sort", "sym", "--percent-limit", "2"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    return "\n".join(ln for ln in report.splitlines() if "%" in ln and not ln.startswith("#"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="5000,10000,20000")
    ap.add_argument("--perf", action="store_true", help="perf profile of the largest load")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 1
    if args.perf and shutil.which("perf") is None:
        print("--perf needs perf (Debian's linux-perf)", file=sys.stderr)
        return 1
    loads: list[tuple[int, float]] = []
    rules = ""
    for n in (int(s) for s in args.sizes.split(",")):
        progress(f"{n} services: rendering and loading ...")
        rules, _ = render(n, 10, "nftables")
        loads.append((n, restore_plainly(rules, "nftables")))
        progress(f"  loaded in {loads[-1][1]:.1f}s")
    print(f"Measured on {machine()}.\n")
    print("| services x endpoints | nft -f into an empty namespace | per 1,000 services |")
    print("|---|---|---|")
    for n, s in loads:
        print(f"| {n:,} x 10 | {s:.1f} s | {s / n * 1000:.2f} s |")
    if args.perf:
        print(f"\nperf (cpu-clock), the load at {loads[-1][0]:,}:\n{perf_top(rules)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
