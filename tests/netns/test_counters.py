"""Per-service counters grow by the number of connections sent, in each mode that runs here
(IPVS: tests/ipvs_guest): ``pyproxy status`` from the kernel (iptables rule counters, nftables
named counters) or the daemon (the userspace relay), /debug/traffic, and the
``pyproxy_service_*`` metrics ``--service-metrics`` turns on, capped at
``--service-metrics-max-series`` service ports."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.netns.scrape import get, metric, scrape
from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    PYPROXY,
    Pyproxy,
    World,
    manifest_objects,
    wait_for,
)

pytestmark = pytest.mark.netns
PYPROXY_MODES = ("iptables", "nftables", "userspace")
PYPROXY_FLAGS = ("--metrics-bind-address", "127.0.0.1:10249", "--service-metrics",
                 "--service-metrics-max-series", "1")  # fmt: skip
BASE = "http://127.0.0.1:10249"
SENT = 25
LABELS = '{namespace="t",port="http",service="cnt-a"}'


def counts(world: World, proxy: Pyproxy) -> dict[str, Any]:
    """Every place that counts t/cnt-a:http's connections, and their packets and bytes."""
    text = scrape(world)
    out: dict[str, Any] = {
        f"metric {what}": metric(text, f"pyproxy_service_{what}_total", LABELS)
        for what in ("connections", "packets", "bytes")
    }
    traffic = json.loads(get(world, BASE + "/debug/traffic")["body"])["t/cnt-a:http"]
    out |= {f"daemon {k}": v for k, v in traffic.items()}
    args = ["--from-daemon", BASE] if proxy.mode == "userspace" else []
    doc = json.loads(world.exec(world.node, PYPROXY, "status", "--mode", proxy.mode, *args,
                                "-o", "json").stdout)  # fmt: skip
    if proxy.mode == "iptables":
        out["status connections"] = sum(p for p, _ in doc["counters"]["t/cnt-a:http"]
                                        ["endpoints"].values())  # fmt: skip
    elif proxy.mode == "nftables":
        out["status connections"] = doc["nftables"]["t/cnt-a:http"]["connections"]
    else:
        out["status connections"] = doc["traffic"]["t/cnt-a:http"]["connections"]
    return out


def test_counters_grow_by_the_connections_sent(world: World, proxy: Pyproxy) -> None:
    proxy.write("cnt", *manifest_objects(world, svc("cnt-a", "10.96.45.1", [HTTP]),
                                         pods(world, 1, 2), HTTP_EP),
                *manifest_objects(world, svc("cnt-b", "10.96.45.2", [HTTP]),
                                  pods(world, 3), HTTP_EP))  # fmt: skip
    reachable(world, "10.96.45.1")
    reachable(world, "10.96.45.2")
    before = counts(world, proxy)
    real = world.probe("tcp", "10.96.45.1", 80, count=SENT)
    assert sum(real["replies"].values()) == SENT and not real["errors"], real
    after = counts(world, proxy)
    grew = {k: after[k] - before[k] for k in after if after[k] is not None}
    for key in ("metric connections", "daemon connections", "status connections"):
        assert grew[key] == SENT, (key, before, after)
    if proxy.mode == "userspace":  # the relay sees no packets; it counts payload bytes
        assert after["daemon packets"] is None and grew["daemon bytes"] > 0, after
    else:  # the nat rules see each connection's first packet only
        assert grew["metric packets"] == grew["daemon packets"] == SENT, (before, after)
        assert grew["daemon bytes"] > 0
    text = scrape(world)  # the cap: one service port, the first in name order
    series = [ln for ln in text.splitlines()
              if ln.startswith("pyproxy_service_connections_total{")]  # fmt: skip
    assert series == [f"pyproxy_service_connections_total{LABELS} {after['metric connections']}"]
    assert metric(text, "pyproxy_service_metrics_omitted_ports") == 1.0
    if proxy.mode == "nftables":  # the counters are pyproxy's objects: diff knows them
        res = world.exec(
            world.node, PYPROXY, "diff", "--mode", "nftables", "--manifests",
            str(proxy.manifests), "--hostname-override", "node-a", "--cluster-cidr",
            f"{CLUSTER_CIDR},{CLUSTER_CIDR6}", "--service-metrics", check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
    proxy.remove("cnt")
    if proxy.mode == "nftables":  # a partial sync deletes a gone service's counter
        wait_for(lambda: not [c for c in nft_counters(world) if "/t/cnt-" in c],
                 what="the services' named counters to be deleted")  # fmt: skip


def nft_counters(world: World) -> list[str]:
    out = world.exec(world.node, "nft", "list", "counters", "table", "ip", "kube-proxy").stdout
    return [ln.split()[1] for ln in out.splitlines() if ln.strip().startswith("counter ")]
