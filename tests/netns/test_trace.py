"""``pyproxy trace`` predicts what real connections do: for services covering ClusterIP,
NodePort, LoadBalancer with source ranges, both traffic policies, session affinity and no
endpoints, the endpoints trace says a client can reach (or that it is rejected or dropped, and
whether its source is kept) are exactly what that client's real connections reach."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    NODE_CLIENT_IP,
    PYPROXY,
    Pyproxy,
    World,
    manifest_objects,
)

pytestmark = pytest.mark.netns
PYPROXY_MODES = ("iptables", "nftables")
LB_IP = "192.0.2.50"
NODE_PORT = {**HTTP, "nodePort": 30180}
LB_PORT = {**HTTP, "nodePort": 30181}


def objects(world: World) -> list[dict[str, Any]]:
    c0 = world.client_ip(0)
    lb = svc("tr-lb", "10.96.50.2", [LB_PORT], type="LoadBalancer", externalTrafficPolicy="Local",
             healthCheckNodePort=32150, loadBalancerSourceRanges=[f"{c0}/32"],
             status={"loadBalancer": {"ingress": [{"ip": LB_IP}]}})  # fmt: skip
    other_node = {world.pods[1].name: "node-b", world.pods[2].name: "node-b"}
    return [
        *manifest_objects(world, svc("tr-web", "10.96.50.1", [NODE_PORT], type="NodePort"),
                          pods(world, 1, 2, 3), HTTP_EP),
        *manifest_objects(world, lb, pods(world, 1, 2), HTTP_EP,
                          node_of=lambda p: other_node.get(p.name, "node-a")),
        *manifest_objects(world, svc("tr-loc", "10.96.50.3", [HTTP],
                                     internalTrafficPolicy="Local"),
                          pods(world, 3), HTTP_EP, node_of=lambda p: "node-b"),
        *manifest_objects(world, svc("tr-aff", "10.96.50.4", [HTTP], sessionAffinity="ClientIP"),
                          pods(world, 1, 2, 3), HTTP_EP),
        svc("tr-none", "10.96.50.5", [HTTP]),
    ]  # fmt: skip


def trace(world: World, proxy: Pyproxy, client: str, to: str) -> dict[str, Any]:
    res = world.exec(
        world.node, PYPROXY, "trace", "--mode", proxy.mode, "--manifests", str(proxy.manifests),
        "--hostname-override", "node-a", "--cluster-cidr", f"{CLUSTER_CIDR},{CLUSTER_CIDR6}",
        "--from", client, "--to", to, "-o", "json",
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


# (client index, address, port, what trace must say: pods reached or "reject"/"drop")
CASES = [
    (0, "10.96.50.1", 80, {1, 2, 3}),  # ClusterIP from outside the cluster: masqueraded
    (0, NODE_CLIENT_IP, 30180, {1, 2, 3}),  # NodePort, Cluster policy: masqueraded
    (0, LB_IP, 80, {1}),  # LB IP, allowed source, Local policy: this node's endpoint, source kept
    (1, LB_IP, 80, "drop"),  # LB IP, source outside loadBalancerSourceRanges
    (0, "10.96.50.2", 80, {1, 2}),  # the same service's cluster IP: internal policy Cluster
    (0, NODE_CLIENT_IP, 30181, {1}),  # its NodePort: Local policy, source kept
    (0, "10.96.50.3", 80, "drop"),  # internalTrafficPolicy=Local, no endpoint on this node
    (0, "10.96.50.4", 80, {1, 2, 3}),  # ClientIP affinity: any one of them, then always it
    (0, "10.96.50.5", 80, "reject"),  # no endpoints at all
]


def test_trace_predicts_real_connections(world: World, proxy: Pyproxy) -> None:
    proxy.write("trace", *objects(world))
    for ip in ("10.96.50.1", "10.96.50.2", "10.96.50.4"):
        reachable(world, ip)
    by_ip = {p.ip: p.index for p in world.pods}
    for client, addr, port, expected in CASES:
        where = f"client {client} -> {addr}:{port}"
        doc = trace(world, proxy, world.client_ip(client), f"{addr}:{port}")
        verdicts = {o["verdict"] for o in doc["outcomes"]}
        if isinstance(expected, str):
            assert verdicts == {expected}, (where, doc)
            real = world.probe("tcp", addr, port, count=3, client=client, timeout=1.0)
            kind = "refused" if expected == "reject" else "timeout"
            assert real["errors"] == {kind: 3} and not real["replies"], (where, real)
            continue
        predicted = {by_ip[ep.rpartition(":")[0]] for ep in doc["endpoints"]}
        assert verdicts == {"dnat"} and predicted == expected, (where, doc)
        assert abs(sum(doc["endpoints"].values()) - 1.0) < 1e-6, (where, doc)
        masq = {o["masquerade"] for o in doc["outcomes"]}
        assert len(masq) == 1, (where, doc)
        real = world.probe("tcp", addr, port, count=30, client=client, timeout=2.0)
        assert not real["errors"], (where, real)
        reached = {int(name.rpartition("-")[2]) for name in real["replies"]}
        affinity = any("session affinity" in n for o in doc["outcomes"] for n in o["notes"])
        if affinity:  # every connection of this client goes to the one endpoint it drew
            assert len(reached) == 1 and reached <= predicted, (where, real, doc)
        else:
            assert reached == predicted, (where, real, doc)
        sources = {s for seen in real["sources"].values() for s in seen}
        if masq == {True}:
            assert world.client_ip(client) not in sources, (where, real)
        else:
            assert sources == {world.client_ip(client)}, (where, real)
    proxy.remove("trace")


def test_trace_text_names_the_rules_matched(world: World, proxy: Pyproxy) -> None:
    proxy.write("trace", *objects(world))
    reachable(world, "10.96.50.1")
    res = world.exec(
        world.node, PYPROXY, "trace", "--mode", proxy.mode, "--manifests", str(proxy.manifests),
        "--hostname-override", "node-a", "--from", world.client_ip(1), "--to", f"{LB_IP}:80",
    )  # fmt: skip
    lines = res.stdout.splitlines()
    assert lines[0] == f"TCP {world.client_ip(1)} -> {LB_IP}:80 ({proxy.mode} mode)"
    assert "  => 100.0%: DROPPED (silently)" in lines
    if proxy.mode == "nftables":
        rule = re.compile(r"       chain firewall-[A-Z2-7]{8}-t/tr-lb/tcp/http: ip saddr != "
                          + re.escape(f"{{ {world.client_ip(0)}/32 }} drop"))  # fmt: skip
        assert len([ln for ln in lines if rule.fullmatch(ln)]) == 1, lines
    else:
        drop = [ln for ln in lines if ln.startswith("       -t filter -A KUBE-PROXY-FIREWALL ")]
        assert len(drop) == 1 and drop[0].endswith(f"-d {LB_IP} --dport 80 -j DROP"), lines
    proxy.remove("trace")
