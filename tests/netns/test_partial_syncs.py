"""Partial syncs only: with a long sync period, 20 assorted changes after the first full sync
are programmed by partial syncs alone, and the kernel then holds exactly what a fresh full
render of the same state loads (compared chain by chain, whole rules)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.netns.iptables_compare import canonical, kube_rules, load_in_scratch_namespace
from tests.netns.services import DNS, DNS_EP, HTTP, HTTP_EP, pods, svc
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    PYPROXY,
    Pod,
    Pyproxy,
    World,
    manifest_objects,
    wait_for,
)

pytestmark = pytest.mark.netns
PYPROXY_FLAGS = ("--sync-period", "1h")


def synced(proxy: Pyproxy, how: str) -> int:
    return len(re.findall(rf"synced {how} in ", proxy.log.read_text()))


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


def full_render_loaded(world: World, proxy: Pyproxy) -> dict[str, dict[str, list[str]]]:
    text = subprocess.run(
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
    loaded = load_in_scratch_namespace(world, text.split("# IPv6")[0])
    return {t: canonical(r) for t, r in loaded.items()}


def test_twenty_changes_need_no_full_sync(world: World, proxy: Pyproxy) -> None:
    wait_for(lambda: synced(proxy, "fully") == 1, what="the first full sync")
    steps = changes(world)
    assert len(steps) == 20
    for name, content in steps:
        before = synced(proxy, "partially")
        if content is None:
            proxy.remove(name)
        else:
            proxy.write(name, *content)
        wait_for(lambda b=before: synced(proxy, "partially") > b, what=f"a sync of {name}")
    assert synced(proxy, "fully") == 1
    expected = full_render_loaded(world, proxy)
    got = {t: canonical(kube_rules(world.iptables_save(t))) for t in ("filter", "nat")}
    assert got == expected
    assert any(c.startswith("KUBE-FW-") for c in got["nat"]) is False  # c was removed last
    assert sum(c.startswith("KUBE-SVC-") for c in got["nat"]) >= 5
