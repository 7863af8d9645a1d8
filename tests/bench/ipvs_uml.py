"""Benchmark: IPVS mode at N services, inside user-mode Linux (this machine's kernel has no
IPVS). Boots the guest, runs ``tests.bench.ipvs_guest`` there, and writes its figures to
``tests/bench/results/ipvs_uml.{json,md}``. The guest kernel is slower than the host's: the
figures compare pyproxy with itself across N (a partial sync should stay flat), not with the
host's modes. Usage: python -m tests.bench.ipvs_uml [--sizes 1000,5000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.bench.report import machine
from tests.uml.harness import run, unavailable


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    reason = unavailable()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    print(f"booting user-mode Linux for N = {args.sizes} (minutes) ...", flush=True)
    res = run(f"python -m tests.bench.ipvs_guest --sizes {args.sizes}", timeout=5400, mem="4G")
    print(res.output)
    if res.rc != 0:
        print(f"guest failed (rc={res.rc}):\n{res.console[-3000:]}", file=sys.stderr)
        return 1
    rows = json.loads(res.output.strip().splitlines()[-1])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ipvs_uml.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))
    lines = [
        f"IPVS mode inside user-mode Linux on {machine()}.\n",
        "| services x endpoints | first full sync | one change: sync p50 | RSS | full syncs |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['services']:,} x 10 | {r['full_sync_s']:.1f} s | "
            f"{r['partial_sync_p50_s'] * 1000:.1f} ms | {r['rss_mb']:.0f} MB | {r['full_syncs']} |"
        )
    (out / "ipvs_uml.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
