"""A node switching modes, as upstream's platformCleanup makes it: pyproxy started in nftables
mode removes the iptables mode's chains (of both back ends), and started in iptables mode it
removes the nftables table, each after its own first full sync, and the service answers on the
way. The chains carry kube-proxy's names, so the same holds for a node that kube-proxy served."""

from __future__ import annotations

import pytest

from tests.netns.services import HTTP, HTTP_EP, pods, svc
from tests.netns.world import PYPROXY, Pyproxy, World, manifest_objects, names_in, wait_for

pytestmark = pytest.mark.netns
IP = "10.96.8.1"


def iptables_chains(world: World) -> set[str]:
    """The proxy's top-level nat chains in either back end ('nft:KUBE-SERVICES', ...)."""
    found = set()
    for backend in ("nft", "legacy"):
        for line in world.iptables_save("nat", backend).splitlines():
            name = line[1:].split(" ")[0] if line.startswith(":") else ""
            if name in ("KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODEPORTS"):
                found.add(f"{backend}:{name}")
    return found


def nft_tables(world: World) -> set[str]:
    out = world.exec(world.node, "nft", "list", "tables").stdout
    return {line for line in out.splitlines() if line.endswith(" kube-proxy")}


def answers(world: World) -> bool:
    return names_in(world.probe("tcp", IP, 80, count=3, timeout=1.0)) == {"pod-1"}


def test_each_mode_removes_the_others_objects(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> None:
    d = tmp_path_factory.mktemp("manifests")
    log = d.parent / f"{d.name}-pyproxy.log"
    first = Pyproxy(world, d, log, mode="iptables").start()
    first.write("s", *manifest_objects(world, svc("s", IP, [HTTP]), pods(world, 1), HTTP_EP))
    try:
        wait_for(lambda: answers(world), what="the service in iptables mode")
        assert iptables_chains(world) == {
            "nft:KUBE-SERVICES",
            "nft:KUBE-POSTROUTING",
            "nft:KUBE-NODEPORTS",
        }
        # kube-proxy's legacy back end on the same node: its chains go too.
        world.exec(world.node, "iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES")
    finally:
        first.stop()  # the rules stay, as they do after kube-proxy's pod is deleted
    assert answers(world)
    second = Pyproxy(world, d, log, mode="nftables").start()
    try:
        wait_for(lambda: not iptables_chains(world), what="the iptables chains to go", timeout=30)
        assert nft_tables(world) == {"table ip kube-proxy", "table ip6 kube-proxy"}
        assert answers(world)
    finally:
        second.stop()
    third = Pyproxy(world, d, log, mode="iptables").start()
    try:
        wait_for(lambda: not nft_tables(world), what="the nftables tables to go", timeout=30)
        assert "nft:KUBE-SERVICES" in iptables_chains(world)
        assert answers(world)
    finally:
        third.stop()
        world.exec(world.node, PYPROXY, "cleanup", "--mode=iptables", check=False)
