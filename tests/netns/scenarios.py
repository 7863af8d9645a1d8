"""Scenarios several modes' tests run: 20 changes of different kinds after a first full sync
(partial syncs in iptables, nftables and IPVS mode)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.netns.services import DNS, DNS_EP, HTTP, HTTP_EP, pods, svc
from tests.netns.world import Pod, World, manifest_objects


def objs(
    world: World,
    name: str,
    ip: str,
    ports: list[dict[str, Any]],
    eps: list[Pod],
    ep_ports: list[dict[str, Any]],
    node_of: Callable[[Pod], str] | None = None,
    **spec: Any,
) -> list[dict[str, Any]]:
    return manifest_objects(world, svc(name, ip, ports, **spec), eps, ep_ports, node_of=node_of)


def changes(world: World) -> list[tuple[str, list[dict[str, Any]] | None]]:
    """20 changes of different kinds: (file, its objects, or None to remove it)."""
    lb = {"loadBalancer": {"ingress": [{"ip": "203.0.113.40"}]}}
    b_ports = [{**HTTP, "nodePort": 30401}, {**DNS, "nodePort": 30402}]
    return [
        ("a", objs(world, "a", "10.96.40.1", [HTTP], pods(world, 1, 2), HTTP_EP)),
        (
            "b",
            objs(
                world, "b", "10.96.40.2", b_ports, pods(world, 1), HTTP_EP + DNS_EP, type="NodePort"
            ),
        ),
        ("a", objs(world, "a", "10.96.40.1", [HTTP], pods(world, 1, 2, 3), HTTP_EP)),
        (
            "c",
            objs(
                world,
                "c",
                "10.96.40.3",
                [{**HTTP, "nodePort": 30403}],
                pods(world, 2),
                HTTP_EP,
                type="LoadBalancer",
                status=lb,
                loadBalancerSourceRanges=["172.31.0.2/32"],
            ),
        ),
        (
            "c",
            objs(
                world,
                "c",
                "10.96.40.3",
                [{**HTTP, "nodePort": 30403}],
                pods(world, 2),
                HTTP_EP,
                type="LoadBalancer",
                status=lb,
                loadBalancerSourceRanges=["172.31.0.3/32", "198.51.100.0/24"],
            ),
        ),
        (
            "d",
            objs(
                world,
                "d",
                "10.96.40.4",
                [HTTP],
                pods(world, 3, 4),
                HTTP_EP,
                sessionAffinity="ClientIP",
            ),
        ),
        (
            "d",
            objs(
                world,
                "d",
                "10.96.40.4",
                [HTTP],
                pods(world, 3, 4),
                HTTP_EP,
                sessionAffinity="ClientIP",
                sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
            ),
        ),
        (
            "e",
            objs(
                world,
                "e",
                "10.96.40.5",
                [{**HTTP, "nodePort": 30405}],
                pods(world, 1, 2),
                HTTP_EP,
                node_of=lambda p: "node-a" if p.index == 1 else "node-b",
                type="NodePort",
                externalTrafficPolicy="Local",
            ),
        ),
        (
            "e",
            objs(
                world,
                "e",
                "10.96.40.5",
                [{**HTTP, "nodePort": 30405}],
                pods(world, 1, 2),
                HTTP_EP,
                node_of=lambda p: "node-b",
                type="NodePort",
                externalTrafficPolicy="Local",
            ),
        ),
        ("f", [svc("f", "10.96.40.6", [HTTP])]),
        ("f", objs(world, "f", "10.96.40.6", [HTTP], pods(world, 4), HTTP_EP)),
        (
            "b",
            objs(
                world,
                "b",
                "10.96.40.2",
                [{**HTTP, "nodePort": 30411}, b_ports[1]],
                pods(world, 1),
                HTTP_EP + DNS_EP,
                type="NodePort",
            ),
        ),
        (
            "a",
            objs(
                world,
                "a",
                "10.96.40.1",
                [HTTP],
                pods(world, 1, 2, 3),
                HTTP_EP,
                externalIPs=["198.51.100.40"],
            ),
        ),
        ("d", None),
        (
            "g",
            objs(
                world,
                "g",
                "10.96.40.7",
                [HTTP],
                pods(world, 1, 2),
                HTTP_EP,
                internalTrafficPolicy="Local",
            ),
        ),
        ("h", objs(world, "h", "10.96.40.8", [DNS], pods(world, 2, 3), DNS_EP)),
        ("h", objs(world, "h", "10.96.40.8", [DNS], pods(world, 3), DNS_EP)),
        (
            "a",
            objs(
                world,
                "a",
                "10.96.40.1",
                [HTTP, {**DNS, "name": "dns"}],
                pods(world, 1, 2, 3),
                HTTP_EP + DNS_EP,
                externalIPs=["198.51.100.40"],
            ),
        ),
        ("f", objs(world, "f", "10.96.40.6", [HTTP], [], HTTP_EP)),
        ("c", None),
    ]
