"""iptables mode on the legacy back end: traffic, a restore the kernel refuses, drift repair,
and cleanup that removes pyproxy's rules and nothing else."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.netns.iptables_compare import kube_rules
from tests.netns.services import HTTP, HTTP_EP, pods, reachable, sep_chain, svc
from tests.netns.world import PYPROXY, Pyproxy, World, manifest_objects, total, wait_for

pytestmark = pytest.mark.netns
PYPROXY_FLAGS = ("--iptables-backend", "legacy", "--sync-period", "3s")
BACKEND = "legacy"


def test_legacy_back_end_programs_traffic(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "a", *manifest_objects(world, svc("a", "10.96.3.1", [HTTP]), pods(world, 1, 2), HTTP_EP)
    )
    reachable(world, "10.96.3.1")
    r = world.probe("tcp", "10.96.3.1", 80, count=40)
    assert set(r["replies"]) == {"pod-1", "pod-2"} and total(r) == 40
    assert "KUBE-SERVICES" in world.iptables_save("nat", backend="legacy")
    assert "KUBE-SERVICES" not in world.iptables_save("nat", backend="nft")


def test_refused_restore_keeps_previous_rules_then_recovers(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "b", *manifest_objects(world, svc("b", "10.96.3.2", [HTTP]), pods(world, 1), HTTP_EP)
    )
    reachable(world, "10.96.3.2")
    old_sep = sep_chain("b", world.pods[0].ip)
    # Another agent references pyproxy's endpoint chain, so the kernel refuses to delete it.
    world.exec(world.node, "iptables-legacy", "-t", "nat", "-N", "OTHER-AGENT")
    world.exec(world.node, "iptables-legacy", "-t", "nat", "-A", "OTHER-AGENT", "-j", old_sep)
    try:
        before = proxy.counts()
        proxy.write(
            "b", *manifest_objects(world, svc("b", "10.96.3.2", [HTTP]), pods(world, 3), HTTP_EP)
        )
        wait_for(lambda: proxy.counts().failed > before.failed, what="the failed restore")
        log = proxy.log.read_text()
        # The offending line is logged, marked, with its number in the transaction.
        assert re.search(rf"^> *[0-9]+: -X {old_sep}$", log, re.M)
        # The transaction failed whole: the previous rules are intact and still serve.
        assert world.probe("tcp", "10.96.3.2", 80, count=10)["replies"] == {"pod-1": 10}
    finally:
        world.exec(world.node, "iptables-legacy", "-t", "nat", "-F", "OTHER-AGENT")
        world.exec(world.node, "iptables-legacy", "-t", "nat", "-X", "OTHER-AGENT")
    # The retry is a full sync and succeeds once the reference is gone.
    wait_for(
        lambda: world.probe("tcp", "10.96.3.2", 80, count=1, timeout=1)["replies"] == {"pod-3": 1},
        timeout=30,
        what="the retried full sync",
    )
    assert world.probe("tcp", "10.96.3.2", 80, count=10)["replies"] == {"pod-3": 10}


def test_flushed_tables_are_repaired(world: World, proxy: Pyproxy) -> None:
    """Someone flushes nat (the canary goes too): the next sync period rewrites everything."""
    proxy.write(
        "c", *manifest_objects(world, svc("c", "10.96.3.3", [HTTP]), pods(world, 2), HTTP_EP)
    )
    reachable(world, "10.96.3.3")
    world.exec(world.node, "iptables-legacy", "-t", "nat", "-F")
    world.exec(world.node, "iptables-legacy", "-t", "mangle", "-F")
    world.exec(world.node, "iptables-legacy", "-t", "mangle", "-X", "KUBE-PROXY-CANARY")
    reachable(world, "10.96.3.3")  # within a sync period (3s here)
    assert world.probe("tcp", "10.96.3.3", 80, count=5)["replies"] == {"pod-2": 5}


def test_cleanup_removes_pyproxy_rules_and_nothing_else(world: World, proxy: Pyproxy) -> None:
    for backend in ("legacy", "nft"):
        world.exec(world.node, f"iptables-{backend}", "-t", "filter", "-N", "USER-RULES")
        world.exec(
            world.node,
            f"iptables-{backend}",
            "-t",
            "filter",
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "--dport",
            "2222",
            "-j",
            "USER-RULES",
        )
        world.exec(
            world.node,
            f"iptables-{backend}",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            "10.99.0.0/16",
            "-j",
            "MASQUERADE",
        )
    proxy.stop()
    res = world.exec(world.node, PYPROXY, "cleanup", "--mode=iptables")
    assert res.returncode == 0
    for backend in ("legacy", "nft"):
        for table in ("filter", "nat", "mangle"):
            text = world.iptables_save(table, backend=backend)
            assert "KUBE-" not in text, (backend, table, text)
        assert "USER-RULES" in world.iptables_save("filter", backend=backend)
        assert "-A INPUT -p tcp -m tcp --dport 2222 -j USER-RULES" in world.iptables_save(
            "filter", backend=backend
        )
        assert "-s 10.99.0.0/16 -j MASQUERADE" in world.iptables_save("nat", backend=backend)
    # A second cleanup has nothing to do and still succeeds.
    assert (
        subprocess.run(
            ["ip", "netns", "exec", world.node, PYPROXY, "cleanup"], capture_output=True
        ).returncode
        == 0
    )
    assert kube_rules(world.iptables_save("nat", backend="legacy")) == {}
