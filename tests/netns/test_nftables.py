"""nftables mode only: what the kernel's kube-proxy table holds after partial syncs, stale
chains flushed then deleted, SCTP, and cleanup. Traffic in nftables mode is covered by
test_traffic.py, which runs once per mode."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.netns import nft_compare
from tests.netns.scenarios import changes
from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    PYPROXY,
    Pyproxy,
    SyncCounts,
    World,
    manifest_objects,
    wait_for,
)

pytestmark = pytest.mark.netns
PYPROXY_MODE = "nftables"
PYPROXY_FLAGS = ("--sync-period", "1h")


def fresh_load(world: World, proxy: Pyproxy) -> dict[str, object]:
    """What a full sync of the same manifests writes into an empty namespace."""
    text = subprocess.run(
        [PYPROXY, "render", "--mode=nftables", "--manifests", str(proxy.manifests),
         "--node", "node-a", "--cluster-cidr", f"{CLUSTER_CIDR},{CLUSTER_CIDR6}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return nft_compare.load_in_scratch_namespace(world, text.split("# IPv6")[0])


def test_twenty_partial_syncs_leave_what_a_full_load_writes(world: World, proxy: Pyproxy) -> None:
    now = proxy.wait_syncs(SyncCounts(), full=True, what="the first full sync")
    for name, content in changes(world):
        if content is None:
            proxy.remove(name)
        else:
            proxy.write(name, *content)
        now = proxy.wait_programmed(now, what=f"a sync of {name}")
    expected = fresh_load(world, proxy)
    # Chains of removed services are flushed at once and deleted a second later.
    got = wait_for(
        lambda: (lambda t: t if t == expected else None)(nft_compare.table(world, world.node)),
        timeout=10,
        what="the kernel's table to equal a fresh full load",
    )
    assert proxy.counts().full == 1
    assert sum(k.startswith("chain service-") for k in got) >= 5


def test_removed_service_chain_is_flushed_then_deleted(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "gone", *manifest_objects(world, svc("gone", "10.96.11.1", [HTTP]), pods(world, 1), HTTP_EP)
    )
    reachable(world, "10.96.11.1")
    chain = next(k for k in nft_compare.table(world, world.node) if "t/gone/tcp/http" in k)
    proxy.remove("gone")
    wait_for(
        lambda: nft_compare.table(world, world.node).get(chain) is None,
        timeout=10,
        what=f"{chain} to be deleted",
    )
    assert world.probe("tcp", "10.96.11.1", 80, count=2, timeout=1.0)["replies"] == {}


def test_sctp_elements_load(world: World, proxy: Pyproxy) -> None:
    """This kernel has no SCTP sockets, so no SCTP traffic; the objects must still load."""
    port = {"name": "s", "port": 9999, "protocol": "SCTP", "nodePort": 30199}
    proxy.write(
        "sctp",
        *manifest_objects(
            world,
            svc("sctp", "10.96.11.2", [port], type="NodePort"),
            pods(world, 1),
            [{"name": "s", "port": 9999, "protocol": "SCTP"}],
        ),
    )
    got = wait_for(
        lambda: (lambda t: t if "10.96.11.2 . sctp . 9999" in str(t) else None)(
            nft_compare.table(world, world.node)
        ),
        what="the SCTP service in the table",
    )
    nodeports = got["map service-nodeports"]["elements"]
    assert any(
        re.fullmatch(r"sctp \. 30199 : goto external-\S+-t/sctp/sctp/s", e) for e in nodeports
    )


def test_cleanup_deletes_both_tables_and_nothing_else(world: World, proxy: Pyproxy) -> None:
    world.exec(world.node, "nft", "add", "table", "ip", "someone-else")
    proxy.stop()
    assert world.exec(world.node, PYPROXY, "cleanup", "--mode=nftables").returncode == 0
    tables = world.exec(world.node, "nft", "list", "tables").stdout.split("\n")
    assert "table ip someone-else" in tables
    assert not [t for t in tables if t.endswith(" kube-proxy")], tables
    world.exec(world.node, "nft", "delete", "table", "ip", "someone-else")
