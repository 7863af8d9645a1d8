"""``pyproxy status``: the daemon's own status (mode, last sync, pending changes, counts,
skipped objects; from its /debug/state) and what it counted per service port. The kernel's
counters in a mode's own terms are the mode's (its ``Mode.counters``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def traffic_report(doc: Mapping[str, Mapping[str, int | None]]) -> str:
    """The daemon's /debug/traffic: per service port, what its mode counted."""
    out = ["per service port, as the daemon counts them:",
           f"  {'SERVICE PORT':40} {'CONNECTIONS':>11} {'PACKETS':>10} {'BYTES':>12}"]  # fmt: skip
    for name, t in sorted(doc.items()):
        packets = "-" if t.get("packets") is None else str(t["packets"])
        octets = "-" if t.get("bytes") is None else str(t["bytes"])
        out.append(f"  {name:40} {t['connections']:>11} {packets:>10} {octets:>12}")
    return "\n".join(out) + "\n"


def summary(state: dict[str, Any]) -> str:
    """The daemon's own status, from its /debug/state document."""
    last = state.get("lastSync") or {}
    when = (
        datetime.fromtimestamp(last["finished"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if last.get("finished")
        else "never"
    )
    services = state.get("services", {})
    ports = [p for ps in services.values() for p in ps]
    endpoints = sum(len(p.get("endpoints", ())) for p in ports)
    pending = state.get("pending", {})
    out = [
        f"mode: {state.get('mode')}   node: {state.get('nodeName')}",
        "last sync: "
        + (
            f"{'full' if last.get('full') else 'partial'}, {when}, {last.get('seconds', 0):.3f}s, "
            + ("ok" if last.get("ok") else f"FAILED: {last.get('error')}")
            if last
            else "none yet"
        ),
        f"syncs: {state.get('syncs', 0)} ({state.get('fullSyncs', 0)} full, "
        f"{state.get('failedSyncs', 0)} failed)",
        f"pending: {pending.get('serviceChanges', 0)} service, "
        f"{pending.get('endpointChanges', 0)} endpoint changes",
        f"services: {len(services)}   service ports: {len(ports)}   endpoints: {endpoints}",
    ]
    skipped = state.get("skippedCounts") or {}
    out.append(
        "skipped objects: "
        + (", ".join(f"{n} {k}" for k, n in sorted(skipped.items())) if skipped else "none")
    )
    out += [f"  {s['kind']} {s['object']}: {s['reason']}" for s in state.get("skipped", [])[-10:]]
    return "\n".join(out) + "\n"
