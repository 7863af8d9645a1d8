"""The side-by-side benchmark's results as JSON, a markdown table and a PNG plot."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

COLUMNS = (
    ("cold start", "cold_start_s", "s"),
    ("one change: latency p50", "change_latency_p50_s", "ms"),
    ("one change: sync p50", "change_sync_p50_s", "ms"),
    ("1% churn", "churn_1pct_s", "s"),
    ("idle resync", "idle_resync_s", "ms"),
    ("CPU under churn", "churn_cpu_pct", "%"),
    ("RSS under churn", "churn_rss_after_mb", "MB"),
    ("CPU", "cpu_s", "s"),
    ("peak RSS", "peak_rss_mb", "MB"),
    ("kernel floor", "kernel_floor_s", "s"),
    ("ebpf: maps loaded", "cold_start_map_s", "s"),
    ("ebpf: change in the map", "change_map_p50_s", "ms"),
    ("ebpf: its map write", "change_map_write_p50_s", "ms"),
    ("ebpf: the sync less its map write", "change_rules_sync_p50_s", "ms"),
)


def machine() -> str:
    cpus = len(
        [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("processor")]
    )
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // (1024 * 1024)
    return (
        f"{platform.node() or 'this machine'}: {cpus} cores, {mem} GB, Linux {platform.release()}"
    )


def cell(row: dict[str, Any], key: str, unit: str) -> str:
    if key not in row or row[key] is None:
        if "slow" in row and key not in ("cpu_s", "peak_rss_mb", "kernel_floor_s"):
            return "> 15 min"
        return "n/a" if key != "idle_resync_s" else "none"
    value = row[key] * (1000 if unit == "ms" else 1)
    return f"{value:.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def markdown(rows: list[dict[str, Any]], render: dict[str, float] | None = None) -> str:
    head = ["services x endpoints", "proxy", *(c[0] for c in COLUMNS)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name = f"{r['proxy']} ({r['mode']})"
        cells = [f"{r['services']:,} x {r['endpoints']}", name]
        out.append("| " + " | ".join(cells + [cell(r, k, u) for _, k, u in COLUMNS]) + " |")
    if render:
        out.append(
            f"\n`pyproxy render` at {render['services']:,} x {render['endpoints']}: "
            f"{render['render_s']:.2f} s; the kernel floor for the same rules: "
            f"{render['floor_s']:.2f} s"
        )
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (
        ("cold start (s)", "cold_start_s", 1),
        ("one endpoint change: network programming p50 (ms)", "change_latency_p50_s", 1000),
        ("one endpoint change: sync duration p50 (ms)", "change_sync_p50_s", 1000),
    )
    for ax, (title, key, scale) in zip(axes, panels, strict=True):
        for proxy in sorted({(r["proxy"], r["mode"]) for r in rows}):
            pts = [(r["services"], r[key] * scale) for r in rows
                   if (r["proxy"], r["mode"]) == proxy and r.get(key) is not None]  # fmt: skip
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", label=f"{proxy[0]} ({proxy[1]})")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("services (10 endpoints each)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"pyproxy beside upstream kube-proxy v1.36.3 - {machine()}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rows: list[dict[str, Any]], out: Path, render: dict[str, float] | None = None) -> None:
    doc = {"machine": machine(), "rows": rows, "render": render}
    (out / "side_by_side.json").write_text(json.dumps(doc, indent=1))
    (out / "side_by_side.md").write_text(f"Measured on {machine()}.\n\n" + markdown(rows, render))
    try:
        plot(rows, out / "side_by_side.png")
    except ImportError:
        pass  # matplotlib is a dev dependency; the JSON and table are written anyway
