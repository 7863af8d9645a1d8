"""Operating pyproxy: metrics move with syncs, /healthz and /livez follow sync health and the
node, health-check node ports follow local endpoints. All over real HTTP inside the node
namespace (loopback there) or from a client namespace."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.netns.scrape import get, metric, scrape
from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import Pyproxy, World, manifest_objects, wait_for

pytestmark = pytest.mark.netns
PYPROXY_FLAGS = (
    "--metrics-bind-address",
    "127.0.0.1:10249",
    "--healthz-bind-address",
    "0.0.0.0:10256",
    "--sync-period",
    "1s",
)


def test_metrics_move_with_syncs(world: World, proxy: Pyproxy) -> None:
    wait_for(
        lambda: get(world, "http://127.0.0.1:10249/metrics")["code"] == 200,
        what="the metrics server",
    )
    proxy.write(
        "m1", *manifest_objects(world, svc("m1", "10.96.5.1", [HTTP]), pods(world, 1), HTTP_EP)
    )
    reachable(world, "10.96.5.1")
    before = scrape(world)
    fam = '{ip_family="IPv4"}'
    count0 = metric(before, "kubeproxy_sync_proxy_rules_duration_seconds_count", fam)
    last0 = metric(before, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", fam)
    eps0 = metric(before, "kubeproxy_sync_proxy_rules_endpoint_changes_total")
    svcs0 = metric(before, "kubeproxy_sync_proxy_rules_service_changes_total")
    assert count0 >= 1 and last0 > 0 and svcs0 >= 1
    proxy.write(
        "m1", *manifest_objects(world, svc("m1", "10.96.5.1", [HTTP]), pods(world, 1, 2), HTTP_EP)
    )
    wait_for(
        lambda: metric(scrape(world), "kubeproxy_sync_proxy_rules_endpoint_changes_total") > eps0,
        what="the endpoint change to be counted",
    )
    after = scrape(world)
    assert metric(after, "kubeproxy_sync_proxy_rules_duration_seconds_count", fam) > count0
    assert metric(after, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", fam) > last0
    assert metric(after, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 0
    assert metric(after, "kubeproxy_network_programming_duration_seconds_count", fam) >= 1
    assert (
        metric(after, "kubeproxy_sync_proxy_rules_iptables_total", '{ip_family="IPv4",table="nat"}')
        > 10
    )
    assert (
        'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"}' in after
    )  # upstream's buckets: ExponentialBuckets(0.001, 2, 15)
    assert get(world, "http://127.0.0.1:10249/proxyMode")["body"] == "iptables"


def test_healthz_follows_sync_health(world: World, proxy: Pyproxy) -> None:
    ok = get(world, "http://127.0.0.1:10256/healthz")
    assert ok["code"] == 200 and ok["type"] == "application/json"
    body = json.loads(ok["body"])
    assert set(body) == {"lastUpdated", "currentTime", "nodeEligible"}
    assert set(json.loads(get(world, "http://127.0.0.1:10256/livez")["body"])) == {
        "lastUpdated",
        "currentTime",
    }
    # Block syncs: another agent references a chain pyproxy must delete.
    from tests.netns.services import sep_chain

    proxy.write(
        "h1", *manifest_objects(world, svc("h1", "10.96.5.2", [HTTP]), pods(world, 1), HTTP_EP)
    )
    reachable(world, "10.96.5.2")
    world.exec(world.node, "iptables-nft", "-t", "nat", "-N", "BLOCKER")
    world.exec(
        world.node,
        "iptables-nft",
        "-t",
        "nat",
        "-A",
        "BLOCKER",
        "-j",
        sep_chain("h1", world.pods[0].ip),
    )
    try:
        proxy.write(
            "h1", *manifest_objects(world, svc("h1", "10.96.5.2", [HTTP]), pods(world, 2), HTTP_EP)
        )
        # health timeout = 2 x sync period (1s here)
        wait_for(
            lambda: get(world, "http://127.0.0.1:10256/healthz")["code"] == 503,
            timeout=20,
            what="/healthz to report the stuck sync",
        )
        assert get(world, "http://127.0.0.1:10256/livez")["code"] == 503
    finally:
        world.exec(world.node, "iptables-nft", "-t", "nat", "-F", "BLOCKER")
        world.exec(world.node, "iptables-nft", "-t", "nat", "-X", "BLOCKER")
    wait_for(
        lambda: get(world, "http://127.0.0.1:10256/healthz")["code"] == 200,
        timeout=30,
        what="/healthz to recover",
    )
    failures = metric(
        scrape(world),
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        '{ip_family="IPv4"}',
    )
    assert failures >= 1
    assert metric(scrape(world), "kubeproxy_proxy_healthz_total", '{code="503"}') >= 1


def test_healthz_reflects_node_being_drained(world: World, proxy: Pyproxy) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a"},
        "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
    }
    proxy.write("node", node)
    wait_for(
        lambda: get(world, "http://127.0.0.1:10256/healthz")["code"] == 503,
        what="/healthz to see the taint",
    )
    assert json.loads(get(world, "http://127.0.0.1:10256/healthz")["body"])["nodeEligible"] is False
    assert get(world, "http://127.0.0.1:10256/livez")["code"] == 200  # livez ignores the node
    proxy.remove("node")
    wait_for(
        lambda: get(world, "http://127.0.0.1:10256/healthz")["code"] == 200,
        what="/healthz after the taint is gone",
    )


def test_health_check_node_port_follows_local_endpoints(world: World, proxy: Pyproxy) -> None:
    def lb(node_of: Any) -> list[dict[str, Any]]:
        return manifest_objects(
            world,
            svc(
                "hc",
                "10.96.5.3",
                [{**HTTP, "nodePort": 30090}],
                type="LoadBalancer",
                externalTrafficPolicy="Local",
                healthCheckNodePort=32000,
                status={"loadBalancer": {"ingress": [{"ip": "203.0.113.30"}]}},
            ),
            pods(world, 1, 2),
            HTTP_EP,
            node_of=node_of,
        )

    proxy.write("hc", *lb(lambda p: "node-a" if p.name == "pod-1" else "node-b"))
    url = "http://172.31.0.1:32000/"
    client = world.client(0)
    r = wait_for(
        lambda: (lambda x: x if x["code"] == 200 else None)(get(world, url, client)),
        what="the health check node port",
    )
    assert json.loads(r["body"]) == {
        "service": {"namespace": "t", "name": "hc"},
        "localEndpoints": 1,
        "serviceProxyHealthy": True,
    }
    proxy.write("hc", *lb(lambda p: "node-b"))  # no endpoint on this node any more
    r = wait_for(
        lambda: (lambda x: x if x["code"] == 503 else None)(get(world, url, client)),
        what="the health check to turn 503",
    )
    assert json.loads(r["body"])["localEndpoints"] == 0
    proxy.remove("hc")
    wait_for(lambda: get(world, url, client)["code"] == 0, what="the health check port to close")
