"""Benchmark beside upstream kube-proxy, on one machine, against one API server state.

For each N (services, M endpoints each, created through the API server of tests/cluster;
past 10,000 written to its store, ``objects.API_CREATES`` says why),
upstream kube-proxy v1.36.3 and pyproxy run one after the other, each in a fresh node
namespace with default flags (plus the kubeconfig, node name and cluster CIDR both need),
and each is measured for:

  cold start      process start to the end of its first sync (its own
                  kubeproxy_sync_proxy_rules_last_timestamp_seconds), checked in the kernel
  one change      one EndpointSlice's endpoints replaced: network-programming latency (the
                  proxy's own kubeproxy_network_programming_duration_seconds, measured from the
                  slice's last-change-trigger-time) and that sync's duration; 5 times, p50
  1% churn        1% of the slices changed at once: time until all are programmed
  idle resync     a periodic sync with nothing changed (upstream 1.36 runs none: its runner's
                  maximum interval is an hour)
  steady churn    one endpoint change a second for --churn-seconds (300): CPU as a share of
                  a core, child processes included, and RSS before and after
  CPU, RSS        CPU seconds used and peak resident memory, from /proc
plus the kernel floor (the same rules restored into an empty namespace, plainly) and
``pyproxy render`` time at 2,000 x M beside the floor for those rules.

A proxy that has not finished a row within the cap (15 minutes) is reported as "> 15 min"
and the run goes on. Writes JSON, a markdown table and a PNG plot to --out, with progress on
stdout. ``--quick`` (N = 200, no plot needed) runs in CI and fails only on a crash.
Usage: python -m tests.bench.side_by_side [--quick] [--sizes 1000,5000,10000] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench import entry, objects, report
from tests.bench.kernel_floor import floor_of_namespace, render_beside_floor
from tests.bench.proxies import Proxy
from tests.cluster.cluster import Cluster

CAP = 15 * 60.0
M = 10
GENERATIONS = itertools.count(1)
"""Each write of new endpoints uses a generation never used before in the run: a slice
rewritten with the addresses it already has is no change (neither proxy reprograms it), and
the cluster is kept from one size to the next."""
LAST = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
NPL = "kubeproxy_network_programming_duration_seconds"
SYNC = "kubeproxy_sync_proxy_rules_duration_seconds"
PARTIAL = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
FULL = "kubeproxy_sync_full_proxy_rules_duration_seconds"


class Slow(Exception):
    """A row the proxy did not finish within the cap."""


class Crashed(Exception):
    """The proxy process ended."""


FLOOR_UP_TO = 10_000
"""The kernel floor is measured up to this many services: past it, loading nftables rules
grows with the square of the services (18.8 s at 10,000 here, 98 s at 20,000, more than
15 minutes at 50,000) and the floor would double each row's time."""


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait(p: Proxy, done: Callable[[str], bool], cap: float, what: str) -> str:
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline:
        if not p.alive():
            raise Crashed(f"{p.name} exited (see {p.log})")
        text = p.metrics()
        if text and done(text):
            return text
        time.sleep(0.05)
    raise Slow(f"{p.name}: {what} not done within {cap:.0f}s")


def cold_start(p: Proxy, n: int) -> float:
    p.start()
    text = wait(p, lambda t: p.value(t, LAST) > 0, CAP, "the first sync")
    programmed = p.kernel_services()
    if programmed < n:
        raise Slow(f"{p.name}: first sync programmed {programmed} of {n} services")
    return p.value(text, LAST) - p.started


def histogram(p: Proxy, text: str, name: str) -> tuple[float, float]:
    return p.value(text, f"{name}_count"), p.value(text, f"{name}_sum")


def settle() -> None:
    """Let the proxy's min-sync-period (1 s by default, both proxies) pass, so each change
    meets an idle proxy instead of the rate limit left by the previous one."""
    time.sleep(2.0)


def one_change(p: Proxy, cluster: Cluster, n: int) -> tuple[float, float]:
    """(network-programming latency, sync duration) of one EndpointSlice change; in ebpf
    mode also noted: how long after pyproxy saw it the change was in the socket map."""
    settle()
    before = p.metrics()
    c0, s0 = histogram(p, before, NPL)
    d0, ds0 = histogram(p, before, SYNC)
    objects.change_endpoints(cluster, [random.randrange(n)], M, next(GENERATIONS))
    # Upstream observes the latency inside a sync and its duration as the sync returns, after
    # its conntrack clean-up: wait for both.
    after = wait(
        p,
        lambda t: histogram(p, t, NPL)[0] > c0 and histogram(p, t, SYNC)[0] > d0,
        CAP,
        "one change",
    )
    c1, s1 = histogram(p, after, NPL)
    d1, ds1 = histogram(p, after, SYNC)
    if p.mode == "ebpf":
        p.map_latencies.append(p.value(after, "pyproxy_socket_map_seen_to_written_seconds", ""))
        p.map_writes.append(p.value(after, "pyproxy_socket_map_write_seconds",
                                    '{kind="partial"}'))  # fmt: skip
    return (s1 - s0) / (c1 - c0), (ds1 - ds0) / max(d1 - d0, 1)


def churn(p: Proxy, cluster: Cluster, n: int) -> float:
    """Seconds from the first write of 1% of the slices until all are programmed."""
    chosen = random.sample(range(n), max(1, n // 100))
    settle()
    c0 = histogram(p, p.metrics(), NPL)[0]
    t0 = objects.change_endpoints(cluster, chosen, M, next(GENERATIONS))
    after = wait(p, lambda t: histogram(p, t, NPL)[0] >= c0 + len(chosen), CAP, "1% churn")
    return p.value(after, LAST) - t0


def steady_churn(p: Proxy, cluster: Cluster, n: int, seconds: float) -> dict[str, Any]:
    """One endpoint change a second for ``seconds`` (a large cluster's steady state): the CPU
    the proxy used meanwhile, its child processes included (iptables-restore, nft), as a share
    of one core, and its resident memory before and after."""
    settle()
    rss0, cpu0, t0 = p.rss_mb(), p.cpu_seconds(children=True), time.monotonic()
    out: dict[str, Any] = {"churn_rss_before_mb": rss0}
    minutes: list[dict[str, float]] = []  # a soak's curve: RSS and full syncs, each minute
    for k in range(int(seconds)):
        objects.change_endpoints(cluster, [random.randrange(n)], M, next(GENERATIONS))
        time.sleep(max(0.0, t0 + k + 1 - time.monotonic()))  # the pace: one a second
        if seconds >= 600 and (k + 1) % 60 == 0:
            full = histogram(p, p.metrics(), FULL)[0] if p.name == "pyproxy" else 0
            minutes.append({"minute": (k + 1) // 60, "rss_mb": p.rss_mb(), "full_syncs": full})
        if (k + 1) % 600 == 0:  # a soak: RSS every 10 minutes, the first kept as its base
            out.setdefault("churn_rss_10min_mb", p.rss_mb())
            progress(f"  {p.name}: {(k + 1) // 60} min of churn, RSS {p.rss_mb():.0f} MB")
    if minutes:
        out["churn_minutes"] = minutes
    cpu = p.cpu_seconds(children=True) - cpu0
    out["churn_cpu_pct"] = 100 * cpu / (time.monotonic() - t0)
    out["churn_rss_after_mb"] = p.rss_mb()
    return out


def idle_resync(p: Proxy) -> float | None:
    """A partial sync with nothing changed, waited for up to 40 s (None: there was none)."""
    c0, s0 = histogram(p, p.metrics(), PARTIAL)
    if p.name != "pyproxy":
        return None
    try:
        after = wait(p, lambda t: histogram(p, t, PARTIAL)[0] > c0, 40, "an idle resync")
    except Slow:
        return None
    c1, s1 = histogram(p, after, PARTIAL)
    return (s1 - s0) / (c1 - c0)


def measure(
    p: Proxy, cluster: Cluster, n: int, repeats: int, churn_seconds: float = 0
) -> dict[str, Any]:
    row: dict[str, Any] = {"proxy": p.name, "mode": p.mode, "services": n, "endpoints": M}
    try:
        row["cold_start_s"] = cold_start(p, n)
        progress(f"  {p.name}: cold start {row['cold_start_s']:.2f}s")
        changes = [one_change(p, cluster, n) for _ in range(repeats)]
        row["change_latency_p50_s"] = statistics.median(c[0] for c in changes)
        row["change_sync_p50_s"] = statistics.median(c[1] for c in changes)
        if p.mode == "ebpf":  # the first full write (no full sync since the cold start)
            full = p.value(p.metrics(), "pyproxy_socket_map_write_seconds", '{kind="full"}')
            row["cold_start_map_s"] = full or None
            row["change_map_p50_s"] = (statistics.median(p.map_latencies)
                                       if p.map_latencies else None)  # fmt: skip
            row["change_map_write_p50_s"] = (statistics.median(p.map_writes)
                                             if p.map_writes else None)  # fmt: skip
            # the nftables part: each change's sync less its own map write (the target
            # compares it with nftables mode's sync)
            rules = [c[1] - w for c, w in zip(changes, p.map_writes, strict=True)]
            row["change_rules_sync_p50_s"] = statistics.median(rules) if rules else None
            progress(f"  {p.name}: socket map: full write {row['cold_start_map_s']} s, one "
                     f"change in the map {row['change_map_p50_s']} s after seen")  # fmt: skip
        progress(f"  {p.name}: one change {row['change_latency_p50_s'] * 1000:.0f} ms "
                 f"(sync {row['change_sync_p50_s'] * 1000:.1f} ms)")  # fmt: skip
        row["churn_1pct_s"] = churn(p, cluster, n)
        progress(f"  {p.name}: 1% churn {row['churn_1pct_s']:.2f}s")
        row["idle_resync_s"] = idle_resync(p)
        row["rss_mb"] = p.rss_mb()
        if churn_seconds:
            row.update(steady_churn(p, cluster, n, churn_seconds))
            progress(f"  {p.name}: {churn_seconds:.0f} s of one change a second: "
                     f"{row['churn_cpu_pct']:.2f}% of a core, RSS {row['churn_rss_before_mb']:.0f}"
                     f" -> {row['churn_rss_after_mb']:.0f} MB")  # fmt: skip
    except Slow as err:
        row["slow"] = str(err)
        progress(f"  {err}: > 15 min")
    row["cpu_s"] = p.cpu_seconds() if p.alive() else None
    row["peak_rss_mb"] = p.peak_rss_mb() if p.alive() else None
    return row


def run(
    sizes: list[int],
    modes: list[str],
    out: Path,
    repeats: int,
    proxies: tuple[str, ...] = ("kube-proxy", "pyproxy"),
    churn_seconds: float = 0,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    big = max(sizes) > objects.API_CREATES  # objects past it are written to the store
    with entry.cluster("pyproxy-bench-", "172.30.0.11", storage_json=big) as (cluster, work):
        have = 0
        for n in sizes:
            progress(f"N = {n}: creating services up to {n} ...")
            objects.grow(cluster, have, n, M, progress)
            have = n
            for mode in modes:
                for name in proxies:
                    if mode == "ebpf" and name != "pyproxy":
                        continue  # upstream has no such mode
                    p = Proxy(name, mode, cluster, work)
                    progress(f"N = {n}: {name} ({mode} mode)")
                    try:
                        rows.append(measure(p, cluster, n, repeats, churn_seconds))
                        if name == "pyproxy" and "cold_start_s" in rows[-1] and n <= FLOOR_UP_TO:
                            rows[-1]["kernel_floor_s"] = floor_of_namespace(
                                p.ns, "nftables" if mode == "ebpf" else mode
                            )
                            progress(f"  kernel floor {rows[-1]['kernel_floor_s']:.2f}s")
                    finally:
                        p.stop()
            report.write(rows, out)
    return rows


def main() -> int:
    why = entry.start()
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="N = 200, for CI: fails only on a crash")
    ap.add_argument("--sizes", default="1000,5000,10000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", default="iptables,nftables,iptables-legacy")
    ap.add_argument("--proxies", default="kube-proxy,pyproxy", help="for development runs")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--churn-seconds", type=float, default=300,
                    help="steady churn (one change a second) measured for this long")  # fmt: skip
    args = ap.parse_args()
    if why:
        print(why, file=sys.stderr)
        return 1
    sizes = [200] if args.quick else [int(s) for s in args.sizes.split(",")]
    out = Path(args.out) / ("quick" if args.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    churn_seconds = 10 if args.quick else args.churn_seconds
    rows = run(sizes, args.modes.split(","), out, 3 if args.quick else args.repeats,
               tuple(args.proxies.split(",")), churn_seconds)  # fmt: skip
    if not args.quick:
        render_row = render_beside_floor(2000, M)
        progress(f"pyproxy render at 2,000 x {M}: {render_row['render_s']:.2f}s, "
                 f"floor {render_row['floor_s']:.2f}s")  # fmt: skip
        report.write(rows, out, render_row)
    print(report.markdown(rows))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
