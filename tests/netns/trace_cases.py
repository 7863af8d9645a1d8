"""Services covering ClusterIP, NodePort, LoadBalancer with source ranges, both traffic
policies, session affinity and no endpoints, and a check that ``pyproxy trace``'s prediction
for each (client, address) is what that client's real connections do (tests/netns/test_trace.py;
IPVS mode in tests/ipvs_guest)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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


# (client index, service, address, port, what trace must say: pods reached or "reject"/"drop")
CASES = [
    (0, "tr-web", "10.96.50.1", 80, {1, 2, 3}),  # ClusterIP from outside the cluster: masqueraded
    (0, "tr-web", NODE_CLIENT_IP, 30180, {1, 2, 3}),  # NodePort, Cluster policy: masqueraded
    (0, "tr-lb", LB_IP, 80, {1}),  # LB IP, allowed source, Local policy: this node's endpoint
    (1, "tr-lb", LB_IP, 80, "drop"),  # LB IP, source outside loadBalancerSourceRanges
    (0, "tr-lb", "10.96.50.2", 80, {1, 2}),  # the same service's cluster IP: internal Cluster
    (0, "tr-lb", NODE_CLIENT_IP, 30181, {1}),  # its NodePort: Local policy, source kept
    (0, "tr-loc", "10.96.50.3", 80, "drop"),  # internalTrafficPolicy=Local, none on this node
    (0, "tr-aff", "10.96.50.4", 80, {1, 2, 3}),  # ClientIP affinity: any one, then always it
    (0, "tr-none", "10.96.50.5", 80, "reject"),  # no endpoints at all
]

# IPVS: a virtual server without real servers answers ICMP port unreachable, also for an
# internalTrafficPolicy=Local service with no endpoint on this node.
IPVS = {6: "reject"}
# The userspace relay honours neither externalTrafficPolicy nor loadBalancerSourceRanges (as
# upstream's userspace mode), and REJECTs a service port it has no listener for.
USERSPACE = {2: {1, 2}, 3: {1, 2}, 5: {1, 2}, 6: "reject"}


def _explain_agrees(world: World, proxy: Pyproxy, name: str, addr: str, port: int,
                    traced: dict[str, Any]) -> None:  # fmt: skip
    """``explain``'s path into the same address from outside the cluster ends where the trace
    from the client does (the same endpoints with the same shares, or the same refusal)."""
    res = world.exec(
        world.node, PYPROXY, "explain", f"t/{name}", "--mode", proxy.mode, "--manifests",
        str(proxy.manifests), "--hostname-override", "node-a", "--cluster-cidr",
        f"{CLUSTER_CIDR},{CLUSTER_CIDR6}", "-o", "json",
    )  # fmt: skip
    (doc,) = json.loads(res.stdout)
    label = "NodePort " if addr == NODE_CLIENT_IP else f" {addr}:{port}"
    paths = [p for p in doc["paths"] if p["from"].startswith("outside the cluster")
             and (p["to"].startswith(label) and p["to"].endswith(f":{port}")
                  if label == "NodePort " else p["to"].endswith(label))]  # fmt: skip
    assert len(paths) == 1, (name, addr, doc["paths"])
    assert paths[0]["endpoints"] == traced["endpoints"], (name, paths, traced)
    assert set(paths[0]["verdicts"]) == {o["verdict"] for o in traced["outcomes"]}, (name, paths)


def check_predictions(world: World, proxy: Pyproxy, overrides: Mapping[int, Any]) -> None:
    """Every case of CASES (``overrides``: the mode's own expectations by index)."""
    proxy.write("trace", *objects(world))
    for ip in ("10.96.50.1", "10.96.50.2", "10.96.50.4"):
        reachable(world, ip)
    by_ip = {p.ip: p.index for p in world.pods}
    for i, (client, name, addr, port, expected) in enumerate(CASES):
        expected = overrides.get(i, expected)
        where = f"client {client} -> {addr}:{port}"
        doc = trace(world, proxy, world.client_ip(client), f"{addr}:{port}")
        verdicts = {o["verdict"] for o in doc["outcomes"]}
        if addr != LB_IP or client == 1:  # explain's outside client is not in the LB's ranges
            _explain_agrees(world, proxy, name, addr, port, doc)
        if isinstance(expected, str):
            assert verdicts == {expected}, (where, doc)
            real = world.probe("tcp", addr, port, count=3, client=client, timeout=1.0)
            kind = "refused" if expected == "reject" else "timeout"
            assert real["errors"] == {kind: 3} and not real["replies"], (where, real)
            continue
        predicted = {by_ip[ep.rpartition(":")[0]] for ep in doc["endpoints"]}
        forward = "relay" if proxy.mode == "userspace" else "dnat"
        assert verdicts == {forward} and predicted == expected, (where, doc)
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
