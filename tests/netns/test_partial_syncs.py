"""Partial syncs only: with a long sync period, 20 assorted changes after the first full sync
are programmed by partial syncs alone, and the kernel then holds exactly what a fresh full
render of the same state loads (compared chain by chain, whole rules)."""

from __future__ import annotations

import subprocess

import pytest

from tests.netns.iptables_compare import canonical, kube_rules, load_in_scratch_namespace
from tests.netns.scenarios import changes
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    PYPROXY,
    Pyproxy,
    SyncCounts,
    World,
)

pytestmark = pytest.mark.netns
PYPROXY_FLAGS = ("--sync-period", "1h")


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
    now = proxy.wait_syncs(SyncCounts(), full=True, what="the first full sync")
    steps = changes(world)
    assert len(steps) == 20
    for name, content in steps:
        if content is None:
            proxy.remove(name)
        else:
            proxy.write(name, *content)
        now = proxy.wait_programmed(now, what=f"a sync of {name}")
    assert now.full == 1 and now.failed == 0
    expected = full_render_loaded(world, proxy)
    got = {t: canonical(kube_rules(world.iptables_save(t))) for t in ("filter", "nat")}
    assert got == expected
    assert any(c.startswith("KUBE-FW-") for c in got["nat"]) is False  # c was removed last
    assert sum(c.startswith("KUBE-SVC-") for c in got["nat"]) >= 5
