"""iptables mode with real packets: a node namespace running pyproxy, pod namespaces with echo
servers, client namespaces outside the cluster. Every assertion is about which pod answered
(and what client address it saw), never about pyproxy's own output."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest

from tests.netns.iptables_compare import canonical, kube_rules, load_in_scratch_namespace
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    NODE_CLIENT_IP,
    NODE_CLIENT_IP6,
    PYPROXY,
    Held,
    Pod,
    Pyproxy,
    World,
    manifest_objects,
    names_in,
    total,
    wait_for,
)

pytestmark = pytest.mark.netns


def svc(name: str, ip: str, ports: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    status = spec.pop("status", {})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "t"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": ports, **spec},
        "status": status,
    }


HTTP = {"name": "http", "port": 80, "protocol": "TCP"}
HTTP_EP = [{"name": "http", "port": 8080, "protocol": "TCP"}]
DNS = {"name": "dns", "port": 53, "protocol": "UDP"}
DNS_EP = [{"name": "dns", "port": 5353, "protocol": "UDP"}]


def pods(world: World, *idx: int) -> list[Pod]:
    return [world.pods[i - 1] for i in idx]


def reachable(
    world: World,
    ip: str,
    port: int = 80,
    proto: str = "tcp",
    client: int = 0,
    ns: str | None = None,
    timeout: float = 15.0,
) -> Any:
    def ok() -> Any:
        r = world.probe(proto, ip, port, count=1, client=client, timeout=1.0, ns=ns)
        return r if r["replies"] else None

    return wait_for(ok, timeout=timeout, what=f"{proto} {ip}:{port} to answer")


def test_cluster_ip_spreads_over_ready_endpoints(world: World, proxy: Pyproxy) -> None:
    objs = manifest_objects(
        world, svc("spread", "10.96.1.1", [HTTP]), pods(world, 1, 2, 3), HTTP_EP
    )
    objs[1]["endpoints"].append(
        {"addresses": [world.pods[3].ip], "conditions": {"ready": False}, "nodeName": "node-a"}
    )
    proxy.write("spread", *objs)
    reachable(world, "10.96.1.1")
    r = world.probe("tcp", "10.96.1.1", 80, count=300)
    assert r["errors"] == {}
    assert set(r["replies"]) == {"pod-1", "pod-2", "pod-3"}  # never the unready pod-4
    for pod, n in r["replies"].items():  # binomial(300, 1/3): mean 100, sd 8.2
        assert 50 <= n <= 150, (pod, r["replies"])


def test_node_port_tcp_and_udp_from_outside(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "np",
        *manifest_objects(
            world,
            svc(
                "np",
                "10.96.1.2",
                [{**HTTP, "nodePort": 30081}, {**DNS, "nodePort": 30053}],
                type="NodePort",
            ),
            pods(world, 1, 2),
            HTTP_EP + DNS_EP,
        ),
    )
    reachable(world, NODE_CLIENT_IP, 30081)
    tcp = world.probe("tcp", NODE_CLIENT_IP, 30081, count=60)
    udp = world.probe("udp", NODE_CLIENT_IP, 30053, count=60)
    assert names_in(tcp) == {"pod-1", "pod-2"} and total(tcp) == 60
    assert names_in(udp) == {"pod-1", "pod-2"} and total(udp) == 60
    # externalTrafficPolicy=Cluster: the client's address is masqueraded away.
    seen = {ip for ips in tcp["sources"].values() for ip in ips}
    assert world.client_ip(0) not in seen


def test_load_balancer_ip_and_source_ranges(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "lb",
        *manifest_objects(
            world,
            svc(
                "lb",
                "10.96.1.3",
                [{**HTTP, "nodePort": 30082}],
                type="LoadBalancer",
                loadBalancerSourceRanges=[f"{world.client_ip(0)}/32"],
                status={"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}},
            ),
            pods(world, 1, 2),
            HTTP_EP,
        ),
    )
    reachable(world, "203.0.113.10")
    allowed = world.probe("tcp", "203.0.113.10", 80, count=20, client=0)
    denied = world.probe("tcp", "203.0.113.10", 80, count=2, client=1, timeout=1.0)
    assert total(allowed) == 20
    assert total(denied) == 0 and denied["errors"].get("timeout") == 2  # dropped, not answered


def test_external_ips(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "eip",
        *manifest_objects(
            world,
            svc("eip", "10.96.1.4", [HTTP], externalIPs=["198.51.100.10"]),
            pods(world, 3),
            HTTP_EP,
        ),
    )
    reachable(world, "198.51.100.10")
    assert world.probe("tcp", "198.51.100.10", 80, count=10)["replies"] == {"pod-3": 10}


def test_session_affinity_pins_a_client(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "sticky",
        *manifest_objects(
            world,
            svc(
                "sticky",
                "10.96.1.5",
                [HTTP],
                sessionAffinity="ClientIP",
                sessionAffinityConfig={"clientIP": {"timeoutSeconds": 600}},
            ),
            pods(world, 1, 2, 3),
            HTTP_EP,
        ),
    )
    reachable(world, "10.96.1.5")
    r = world.probe("tcp", "10.96.1.5", 80, count=40)
    assert len(r["replies"]) == 1 and total(r) == 40


def test_external_traffic_policy_local(world: World, proxy: Pyproxy) -> None:
    # pod-1 is on this node (node-a), pod-2 on another node: only pod-1 takes external traffic.
    proxy.write(
        "local",
        *manifest_objects(
            world,
            svc(
                "local",
                "10.96.1.6",
                [{**HTTP, "nodePort": 30083}],
                type="NodePort",
                externalTrafficPolicy="Local",
            ),
            pods(world, 1, 2),
            HTTP_EP,
            node_of=lambda p: "node-a" if p.name == "pod-1" else "node-b",
        ),
    )
    reachable(world, NODE_CLIENT_IP, 30083)
    r = world.probe("tcp", NODE_CLIENT_IP, 30083, count=40)
    assert r["replies"] == {"pod-1": 40}
    assert r["sources"]["pod-1"] == [world.client_ip(0)]  # the client's source IP is preserved
    # Internal traffic still uses every endpoint.
    inside = world.probe("tcp", "10.96.1.6", 80, count=60)
    assert names_in(inside) == {"pod-1", "pod-2"}


def test_removed_endpoint_gets_no_new_connections_after_one_sync(
    world: World, proxy: Pyproxy
) -> None:
    proxy.write(
        "shrink",
        *manifest_objects(world, svc("shrink", "10.96.1.7", [HTTP]), pods(world, 1, 2, 3), HTTP_EP),
    )
    reachable(world, "10.96.1.7")
    assert names_in(world.probe("tcp", "10.96.1.7", 80, count=60)) == {"pod-1", "pod-2", "pod-3"}
    before = proxy.syncs()
    proxy.write(
        "shrink",
        *manifest_objects(world, svc("shrink", "10.96.1.7", [HTTP]), pods(world, 1, 2), HTTP_EP),
    )
    wait_for(lambda: proxy.syncs() > before, what="a sync after the change")
    r = world.probe("tcp", "10.96.1.7", 80, count=60)
    assert names_in(r) == {"pod-1", "pod-2"} and total(r) == 60


def test_service_without_endpoints_is_refused(world: World, proxy: Pyproxy) -> None:
    proxy.write("empty", svc("empty", "10.96.1.8", [HTTP]))
    wait_for(
        lambda: "t/empty:http has no endpoints" in world.iptables_save("filter"),
        what="the REJECT rule",
    )
    r = world.probe("tcp", "10.96.1.8", 80, count=3, timeout=3.0)
    assert r["errors"] == {"refused": 3}  # refused at once, not a timeout


def test_udp_client_follows_replaced_backend(world: World, proxy: Pyproxy) -> None:
    """Same client socket (fixed source port) before and after: conntrack must be cleared."""
    proxy.write(
        "udp", *manifest_objects(world, svc("udp", "10.96.1.9", [DNS]), pods(world, 1), DNS_EP)
    )
    reachable(world, "10.96.1.9", 53, "udp")
    assert world.probe("udp", "10.96.1.9", 53, count=5, sport=40001)["replies"] == {"pod-1": 5}
    before = proxy.syncs()
    proxy.write(
        "udp", *manifest_objects(world, svc("udp", "10.96.1.9", [DNS]), pods(world, 2), DNS_EP)
    )
    wait_for(lambda: proxy.syncs() > before, what="a sync after the change")
    # pod-1 still runs and would still answer if the old conntrack entry survived.
    r = wait_for(
        lambda: (lambda x: x if x["replies"].get("pod-2") else None)(
            world.probe("udp", "10.96.1.9", 53, count=1, sport=40001, timeout=1.0)
        ),
        timeout=5,
        what="the same UDP client to reach pod-2",
    )
    assert r["replies"] == {"pod-2": 1}
    assert world.probe("udp", "10.96.1.9", 53, count=5, sport=40001)["replies"] == {"pod-2": 5}


def test_hairpin_pod_reaches_itself_through_its_service(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "hairpin",
        *manifest_objects(world, svc("hairpin", "10.96.1.10", [HTTP]), pods(world, 1), HTTP_EP),
    )
    pod_ns = world.ns_of(world.pods[0])
    reachable(world, "10.96.1.10", ns=pod_ns)
    r = world.probe("tcp", "10.96.1.10", 80, count=10, ns=pod_ns)
    assert r["replies"] == {"pod-1": 10}
    # Masqueraded, so the reply can come back through the node: the pod sees the node's IP.
    assert r["sources"]["pod-1"] == ["10.244.1.1"]


def test_dual_stack_service(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "dual",
        *manifest_objects(
            world,
            svc(
                "dual",
                "10.96.1.12",
                [{**HTTP, "nodePort": 30084}, {**DNS, "nodePort": 30054}],
                type="NodePort",
                clusterIPs=["10.96.1.12", "fd00:96::12"],
                ipFamilies=["IPv4", "IPv6"],
                ipFamilyPolicy="RequireDualStack",
            ),
            pods(world, 1, 2),
            HTTP_EP + DNS_EP,
            ipv6=True,
        ),
    )
    reachable(world, "fd00:96::12")
    for host, port, proto in (
        ("fd00:96::12", 80, "tcp"),
        ("fd00:96::12", 53, "udp"),
        (NODE_CLIENT_IP6, 30084, "tcp"),
        (NODE_CLIENT_IP6, 30054, "udp"),
        ("10.96.1.12", 80, "tcp"),
    ):
        r = world.probe(proto, host, port, count=40)
        assert names_in(r) == {"pod-1", "pod-2"} and total(r) == 40, (host, port, proto, r)
    assert "fd00:96::12" in world.exec(world.node, "ip6tables-nft-save", "-t", "nat").stdout


def test_sctp_rules_load(world: World, proxy: Pyproxy) -> None:
    """This kernel has no SCTP sockets, so no SCTP traffic; the rules must still load."""
    proxy.write(
        "sctp",
        *manifest_objects(
            world,
            svc(
                "sctp",
                "10.96.1.13",
                [{"name": "s", "port": 9999, "protocol": "SCTP", "nodePort": 30099}],
                type="NodePort",
            ),
            pods(world, 1),
            [{"name": "s", "port": 9999, "protocol": "SCTP"}],
        ),
    )
    wait_for(
        lambda: re.search(
            r"KUBE-NODEPORTS -p sctp .*-m sctp --dport 30099 ", world.iptables_save("nat")
        ),
        what="the SCTP NodePort rule",
    )
    assert "--to-destination 10.244.1.2:9999" in world.iptables_save("nat")


def test_udp_hairpin(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "hairpin-udp",
        *manifest_objects(world, svc("hairpin-udp", "10.96.1.14", [DNS]), pods(world, 1), DNS_EP),
    )
    pod_ns = world.ns_of(world.pods[0])
    reachable(world, "10.96.1.14", 53, "udp", ns=pod_ns)
    r = world.probe("udp", "10.96.1.14", 53, count=10, ns=pod_ns)
    assert r["replies"] == {"pod-1": 10} and r["sources"]["pod-1"] == ["10.244.1.1"]


def test_status_counts_connections_per_endpoint(world: World, proxy: Pyproxy) -> None:
    from pyproxy.tools.status import parse

    proxy.write(
        "counted",
        *manifest_objects(world, svc("counted", "10.96.1.15", [HTTP]), pods(world, 1, 2), HTTP_EP),
    )
    reachable(world, "10.96.1.15")

    def counts() -> dict[str, int]:
        nat = world.exec(world.node, "iptables-nft-save", "-c", "-t", "nat").stdout
        filt = world.exec(world.node, "iptables-nft-save", "-c", "-t", "filter").stdout
        c = parse(nat, filt).get("t/counted:http")
        return {ep: n for ep, (n, _) in c.endpoints.items()} if c else {}

    before = counts()
    r = world.probe("tcp", "10.96.1.15", 80, count=30)
    after = counts()
    by_pod = {"10.244.1.2:8080": "pod-1", "10.244.2.2:8080": "pod-2"}
    delta = {by_pod[ep]: after[ep] - before.get(ep, 0) for ep in after}
    assert {k: v for k, v in delta.items() if v} == r["replies"]  # one DNAT per connection
    out = world.exec(world.node, PYPROXY, "status").stdout
    assert "t/counted:http" in out and "10.244.1.2:8080" in out


def test_kernel_rules_after_partial_syncs_equal_a_full_render(world: World, proxy: Pyproxy) -> None:
    """After all the partial syncs above, the kernel holds what a full sync would write."""
    render = subprocess.run(
        [
            PYPROXY,
            "render",
            "--manifests",
            str(proxy.manifests),
            "--node",
            "node-a",
            "--cluster-cidr",
            f"{CLUSTER_CIDR},{CLUSTER_CIDR6}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    loaded = load_in_scratch_namespace(world, render.split("# IPv6")[0])
    expected = {t: canonical(r) for t, r in loaded.items()}
    got = {t: canonical(kube_rules(world.iptables_save(t))) for t in ("filter", "nat")}
    diff = {
        (t, c): (got[t].get(c), expected[t].get(c))
        for t in got
        for c in set(got[t]) | set(expected[t])
        if got[t].get(c) != expected[t].get(c)
    }
    assert not diff, "\n".join(f"{k}:\n  kernel: {a}\n  render: {b}" for k, (a, b) in diff.items())
    assert len(got["nat"]) > 20  # the comparison covers the services written above


def test_restart_keeps_open_connections(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "held",
        *manifest_objects(world, svc("held", "10.96.1.11", [HTTP]), pods(world, 1, 2), HTTP_EP),
    )
    reachable(world, "10.96.1.11")
    held = Held(world, world.client(0), "10.96.1.11", 80)
    proxy.stop()
    # While pyproxy is down the rules stay: new connections still work.
    assert total(world.probe("tcp", "10.96.1.11", 80, count=10)) == 10
    before = proxy.syncs()
    proxy.start()
    wait_for(lambda: proxy.syncs() > before, what="the restarted pyproxy to sync")
    assert total(world.probe("tcp", "10.96.1.11", 80, count=10)) == 10
    # The connection opened before the restart still talks to the same pod.
    assert held.say("still-there") == [held.pod, "still-there"]
    held.close()
