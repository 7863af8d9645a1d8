"""Reading pyproxy's HTTP endpoints from inside a namespace of the test world, and the
metric families each mode owns (upstream's RegisterMetrics: a mode registers these and no
other mode's)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.netns.world import PYTHON, World

GET = r"""
import json, sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=5)
    code, body, ctype = r.status, r.read().decode(), r.headers.get("Content-Type")
except urllib.error.HTTPError as e:
    code, body, ctype = e.code, e.read().decode(), e.headers.get("Content-Type")
except OSError as e:
    code, body, ctype = 0, str(e), None
print(json.dumps({"code": code, "body": body, "type": ctype}))
"""

METRICS_URL = "http://127.0.0.1:10249/metrics"

MODE_FAMILIES = {
    "iptables": {
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
        "kubeproxy_sync_proxy_rules_iptables_total",
        "kubeproxy_sync_proxy_rules_iptables_last",
    },
    "ipvs": {
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "pyproxy_ipvs_virtual_servers",
        "pyproxy_ipvs_real_servers",
    },
    "userspace": {"pyproxy_userspace_listeners"},
}


def get(world: World, url: str, ns: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(world.exec(ns or world.node, PYTHON, "-c", GET, url).stdout)
    return out


def scrape(world: World) -> str:
    r = get(world, METRICS_URL)
    assert r["code"] == 200, r
    return str(r["body"])


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def families(text: str) -> set[str]:
    """Metric family names, from the ``# TYPE`` lines."""
    return {m.group(1) for m in re.finditer(r"^# TYPE (\S+) \S+$", text, re.M)}


def check_mode_families(text: str, mode: str) -> None:
    """The mode's own families are exported and no family only another mode owns."""
    present = families(text)
    mine = MODE_FAMILIES[mode]
    assert mine <= present, sorted(mine - present)
    others = set().union(*(f for m, f in MODE_FAMILIES.items() if m != mode)) - mine
    assert not others & present, sorted(others & present)
    assert not any(f.endswith("_created") for f in present)  # upstream exports none
