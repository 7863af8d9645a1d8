"""pyproxy against a real API server: real ClusterIP/NodePort allocation, real EndpointSlices
from the real controller, and faults between pyproxy and the API server."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

from tests.cluster.cluster import PYPROXY_TOKEN, Cluster
from tests.cluster.nsrelay import Relay
from tests.e2e.conftest import require_local
from tests.e2e.kube import Kube, eventually
from tests.netns.world import NODE_CLIENT_IP, PYPROXY, PYTHON, Pyproxy, World, names_in, total

PYPROXY_FLAGS = ("--sync-period", "10s", "--min-sync-period", "1s")
NS = "e2e"
WEB = {"app": "web"}
PORTS = [
    {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
    {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"},
]

METRICS = r"""
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:10249/metrics", timeout=5).read().decode())
"""


def metric(world: World, name: str, labels: str = "") -> float:
    text = world.exec(world.node, PYTHON, "-c", METRICS).stdout
    total_ = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if labels in (m.group(1) or ""):
            total_ += float(m.group(2))
    return total_


def answering(
    world: World,
    ip: str,
    port: int,
    expect: set[str],
    proto: str = "tcp",
    count: int = 30,
    timeout: float = 40,
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        r = world.probe(proto, ip, port, count=count, timeout=1.0)
        return r if names_in(r) == expect and total(r) == count else None

    return eventually(check, timeout=timeout, what=f"{ip}:{port} answered by {sorted(expect)}")


@pytest.fixture(scope="module")
def web(kube: Kube, world: World, proxy: Pyproxy) -> dict[str, Any]:
    kube.namespace(NS)
    svc = kube.service(NS, "web", PORTS, WEB, type="NodePort")
    for pod in world.pods[:2]:
        kube.pod(NS, pod.name, "node-a", pod.ip, WEB)
    return svc


def test_service_reachable_through_real_allocations(
    world: World, kube: Kube, web: dict[str, Any]
) -> None:
    svc = kube.get_service(NS, "web")
    cluster_ip = svc["spec"]["clusterIP"]
    node_port = next(p["nodePort"] for p in svc["spec"]["ports"] if p["name"] == "http")
    assert cluster_ip.startswith("10.96.") and 30000 <= node_port <= 32767
    eventually(
        lambda: kube.ready_addresses(NS, "web") == {"10.244.1.2", "10.244.2.2"},
        what="the EndpointSlice controller",
    )
    answering(world, cluster_ip, 80, {"pod-1", "pod-2"})
    answering(world, NODE_CLIENT_IP, node_port, {"pod-1", "pod-2"})
    answering(world, cluster_ip, 53, {"pod-1", "pod-2"}, proto="udp")


def test_diff_against_the_api_server_is_clean(
    world: World, proxy: Pyproxy, web: dict[str, Any]
) -> None:
    """``pyproxy diff --kubeconfig``: one list of the cluster's objects, compared with what the
    daemon programmed from its watches."""
    ip = web["spec"]["clusterIP"]
    answering(world, ip, 80, {"pod-1", "pod-2"})
    kubeconfig = proxy.args[proxy.args.index("--kubeconfig") + 1]
    cidr = proxy.args[proxy.args.index("--cluster-cidr") + 1]
    args = ["--kubeconfig", kubeconfig, "--hostname-override", "node-a", "--cluster-cidr", cidr]
    res = world.exec(world.node, PYPROXY, "diff", *args, check=False)
    assert (res.returncode, res.stdout) == (
        0,
        "no differences: the kernel holds what pyproxy would program\n",
    ), res.stderr


def test_scaling_and_readiness_are_followed(world: World, kube: Kube, web: dict[str, Any]) -> None:
    ip = kube.get_service(NS, "web")["spec"]["clusterIP"]
    kube.pod(NS, "pod-3", "node-a", world.pods[2].ip, WEB)
    answering(world, ip, 80, {"pod-1", "pod-2", "pod-3"}, count=60)
    kube.set_pod_status(NS, "pod-2", world.pods[1].ip, ready=False)
    answering(world, ip, 80, {"pod-1", "pod-3"})
    kube.set_pod_status(NS, "pod-2", world.pods[1].ip, ready=True)
    kube.delete(f"/api/v1/namespaces/{NS}/pods/pod-3")
    answering(world, ip, 80, {"pod-1", "pod-2"})


def test_api_server_down_keeps_rules_then_catches_up(
    world: World, kube: Kube, cluster: Cluster, web: dict[str, Any]
) -> None:
    ip = kube.get_service(NS, "web")["spec"]["clusterIP"]
    reconnects = metric(world, "pyproxy_watch_reconnects_total")
    cluster.stop_apiserver()
    try:
        for _ in range(3):  # pyproxy keeps the last known state: traffic keeps flowing
            r = world.probe("tcp", ip, 80, count=20)
            assert total(r) == 20 and names_in(r) == {"pod-1", "pod-2"}
    finally:
        cluster.start_apiserver()
    eventually(
        lambda: metric(world, "pyproxy_watch_reconnects_total") > reconnects,
        what="pyproxy to notice the outage",
    )
    kube.pod(NS, "pod-4", "node-a", world.pods[3].ip, WEB)
    answering(world, ip, 80, {"pod-1", "pod-2", "pod-4"}, count=60)
    kube.delete(f"/api/v1/namespaces/{NS}/pods/pod-4")
    answering(world, ip, 80, {"pod-1", "pod-2"})


def programmed_rules(world: World) -> list[str]:
    """The node's nat and filter rules as iptables-save prints them, without its comment lines
    and chain counters."""
    text = world.iptables_save("nat") + world.iptables_save("filter")
    return [re.sub(r" \[\d+:\d+\]$", "", ln) for ln in text.splitlines() if not ln.startswith("#")]


def test_watch_cut_10_times_in_60s_resumes_without_relist(
    world: World, kube: Kube, relay: Relay, web: dict[str, Any]
) -> None:
    """The connection to the API server is cut mid-stream every 6 s for a minute: each watch
    resumes from the resourceVersion it holds (no relist) and the rules stay exactly as they
    were; a change after the cuts is followed."""
    ip = kube.get_service(NS, "web")["spec"]["clusterIP"]
    answering(world, ip, 80, {"pod-1", "pod-2"})
    before = programmed_rules(world)
    relists = metric(world, "pyproxy_watch_relists_total")
    reconnects = metric(world, "pyproxy_watch_reconnects_total")
    for i in range(10):
        started = time.monotonic()
        assert relay.cut() >= 3  # the watches (services, slices, node, ...), mid-stream
        want = reconnects + 3 * (i + 1)
        eventually(
            lambda want=want: metric(world, "pyproxy_watch_reconnects_total") >= want,
            what=f"the watches to reconnect after cut {i + 1}",
        )
        time.sleep(max(0.0, started + 6 - time.monotonic()))  # a cut every 6 s: the scenario
    assert metric(world, "pyproxy_watch_relists_total") == relists  # resumed from its RV
    assert programmed_rules(world) == before
    kube.pod(NS, "pod-3", "node-a", world.pods[2].ip, WEB)
    answering(world, ip, 80, {"pod-1", "pod-2", "pod-3"}, count=60)
    assert metric(world, "pyproxy_watch_relists_total") == relists
    kube.delete(f"/api/v1/namespaces/{NS}/pods/pod-3")
    answering(world, ip, 80, {"pod-1", "pod-2"})


def test_partition_then_compaction_forces_relist(
    world: World, kube: Kube, relay: Relay, cluster: Cluster, web: dict[str, Any]
) -> None:
    ip = kube.get_service(NS, "web")["spec"]["clusterIP"]
    relists = metric(world, "pyproxy_watch_relists_total")
    relay.partition()
    try:
        # Changes pyproxy cannot see yet; the old rules keep serving meanwhile.
        kube.pod(NS, "pod-3", "node-a", world.pods[2].ip, WEB)
        kube.service(NS, "late", [PORTS[0]], WEB)
        eventually(lambda: "10.244.3.2" in kube.ready_addresses(NS, "web"), what="the slice")
        assert names_in(world.probe("tcp", ip, 80, count=30)) == {"pod-1", "pod-2"}
        cluster.compact()  # the resourceVersions pyproxy holds are now 410 Gone
    finally:
        relay.heal()
    answering(world, ip, 80, {"pod-1", "pod-2", "pod-3"}, count=60, timeout=90)
    late_ip = kube.get_service(NS, "late")["spec"]["clusterIP"]
    answering(world, late_ip, 80, {"pod-1", "pod-2", "pod-3"}, count=60)
    assert metric(world, "pyproxy_watch_relists_total") > relists
    kube.delete(f"/api/v1/namespaces/{NS}/services/late")
    kube.delete(f"/api/v1/namespaces/{NS}/pods/pod-3")
    answering(world, ip, 80, {"pod-1", "pod-2"})


def test_burst_of_1000_services_is_coalesced(
    world: World, kube: Kube, proxy: Pyproxy, web: dict[str, Any]
) -> None:
    kube.namespace("burst")
    before = proxy.syncs()
    errors: list[str] = []

    def create(start: int) -> None:
        for i in range(start, 1000, 8):
            try:
                kube.service("burst", f"s{i}", [PORTS[0]], {"app": f"none-{i}"})
            except RuntimeError as err:
                errors.append(str(err))

    threads = [threading.Thread(target=create, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    eventually(
        lambda: world.iptables_save("filter").count("burst/s") >= 1000,
        timeout=120,
        what="all 1000 services' REJECT rules",
    )
    syncs = proxy.syncs() - before
    assert 1 <= syncs <= 100, syncs  # min-sync-period 1s coalesces the burst


def test_identity_has_exactly_its_rights(cluster: Cluster) -> None:
    require_local(cluster)

    def can(method: str, path: str, body: Any = None) -> int:
        return cluster.request(method, path, body, token=PYPROXY_TOKEN)[0]

    assert can("GET", "/api/v1/services") == 200
    assert can("GET", "/apis/discovery.k8s.io/v1/endpointslices") == 200
    assert can("GET", "/api/v1/nodes") == 200
    assert can("GET", "/api/v1/secrets") == 403
    assert can("GET", "/api/v1/namespaces/kube-system/secrets") == 403
    assert (
        can(
            "POST",
            "/api/v1/namespaces/default/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "nope"},
                "spec": {"ports": [{"port": 1}]},
            },
        )
        == 403
    )
    assert can("DELETE", "/api/v1/namespaces/e2e/services/web") == 403
    assert (
        can(
            "POST",
            "/api/v1/namespaces/default/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": "x."},
                "involvedObject": {"kind": "Node", "name": "node-a"},
                "reason": "Test",
                "message": "m",
                "type": "Normal",
            },
        )
        == 201
    )


def test_startup_event_recorded(cluster: Cluster, proxy: Pyproxy) -> None:
    def starting() -> list[Any]:
        events = cluster.ok("GET", "/api/v1/namespaces/default/events")["items"]
        return [
            e
            for e in events
            if e.get("reason") == "Starting" and e["involvedObject"].get("name") == "node-a"
        ]

    assert eventually(starting, what="pyproxy's Starting event")


def addresses_in(text: str) -> set[str]:
    """Every IPv4 address in rule text as a whole token (10.96.235.1 is not in
    10.96.235.100)."""
    return set(re.findall(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])", text))


def test_deleting_the_service_removes_its_rules(
    world: World, kube: Kube, web: dict[str, Any]
) -> None:
    ip = kube.get_service(NS, "web")["spec"]["clusterIP"]
    assert ip in addresses_in(world.iptables_save("nat"))
    kube.delete(f"/api/v1/namespaces/{NS}/services/web")
    eventually(
        lambda: ip not in addresses_in(world.iptables_save("nat") + world.iptables_save("filter")),
        what="the service's rules to go",
    )
    # No rule names the service any more (e2e/web, not e2e/web2 of another test).
    assert not re.search(r"(?<![\w/.-])e2e/web(?![\w.-])", world.iptables_save("nat"))
