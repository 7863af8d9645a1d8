"""Every mode that programs the kernel's packet path (iptables, nftables, and ebpf mode's
rules: these clients are outside its socket programs' cgroup, see test_ebpf.py), with real
packets: a node namespace running pyproxy, pod namespaces with echo servers, client
namespaces outside the cluster. Every assertion is about which pod answered (and what client
address it saw), never about pyproxy's own output. The same tests run once per mode."""

from __future__ import annotations

import re

import pytest

from tests.netns.services import DNS, DNS_EP, HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    NODE_CLIENT_IP,
    NODE_CLIENT_IP6,
    Held,
    Pyproxy,
    World,
    manifest_objects,
    names_in,
    total,
    wait_for,
)

pytestmark = pytest.mark.netns
PYPROXY_MODES = ("iptables", "nftables", "ebpf")


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
    # Without pyproxy the packet would leave by the default route and time out.
    wait_for(
        lambda: world.probe("tcp", "10.96.1.8", 80, count=1, timeout=1.0)["errors"],
        what="an answer for the service without endpoints",
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


@pytest.fixture(scope="module")
def second_port(world: World) -> str:
    """A second echo server in pod-1, on UDP 5354, answering with its own name."""
    world.start_echo(world.pods[0], "--name", "port-5354", "--udp", "5354", "--tcp", "8081")
    return "port-5354"


def test_udp_client_follows_a_changed_target_port(
    world: World, proxy: Pyproxy, second_port: str
) -> None:
    """Upstream's "should be able to cleanup conntrack entries when UDP service target port
    changes for a NodePort service": the endpoint keeps its address and moves to another port.
    The same client socket (fixed source port) to the NodePort must reach the new port though
    the old one still answers: the entry to the old address:port is stale and cleared."""
    np = {**DNS, "nodePort": 30055}
    objs = manifest_objects(
        world, svc("retarget", "10.96.1.19", [np], type="NodePort"), pods(world, 1), DNS_EP
    )
    proxy.write("retarget", *objs)
    reachable(world, NODE_CLIENT_IP, 30055, "udp")
    r = world.probe("udp", NODE_CLIENT_IP, 30055, count=5, sport=40002)
    assert r["replies"] == {"pod-1": 5}
    before = proxy.syncs()
    objs[1]["ports"] = [{**DNS_EP[0], "port": 5354}]
    proxy.write("retarget", *objs)
    wait_for(lambda: proxy.syncs() > before, what="a sync after the change")
    r = wait_for(
        lambda: (lambda x: x if x["replies"].get(second_port) else None)(
            world.probe("udp", NODE_CLIENT_IP, 30055, count=1, sport=40002, timeout=1.0)
        ),
        timeout=5,
        what="the same UDP client to reach the new target port",
    )
    assert r["replies"] == {second_port: 1}
    r = world.probe("udp", NODE_CLIENT_IP, 30055, count=5, sport=40002)
    assert r["replies"] == {second_port: 5}


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
    assert "fd00:96::12" in programmed_addresses(world, proxy.mode, 6)


def programmed_addresses(world: World, mode: str, version: int) -> set[str]:
    """Every address written in the mode's rules for one IP family, as whole tokens."""
    if mode in ("nftables", "ebpf"):  # ebpf mode's rules are nftables mode's table
        family = "ip" if version == 4 else "ip6"
        text = world.exec(world.node, "nft", "list", "table", family, "kube-proxy").stdout
    else:
        tool = "iptables-nft-save" if version == 4 else "ip6tables-nft-save"
        text = world.exec(world.node, tool, "-t", "nat").stdout
    return {m.group(0) for m in ADDRESS.finditer(text)}


ADDRESS = re.compile(
    r"(?<![\w:.])(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7})(?![\w:.])"
)


def test_udp_hairpin(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "hairpin-udp",
        *manifest_objects(world, svc("hairpin-udp", "10.96.1.14", [DNS]), pods(world, 1), DNS_EP),
    )
    pod_ns = world.ns_of(world.pods[0])
    reachable(world, "10.96.1.14", 53, "udp", ns=pod_ns)
    r = world.probe("udp", "10.96.1.14", 53, count=10, ns=pod_ns)
    assert r["replies"] == {"pod-1": 10} and r["sources"]["pod-1"] == ["10.244.1.1"]


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
