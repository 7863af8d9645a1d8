"""iptables mode only: what the rules look like to iptables-save (SCTP rules load, per-endpoint
counters). The kernel after partial syncs equal to a full render: test_partial_syncs.py."""

from __future__ import annotations

import re

import pytest

from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    PYPROXY,
    Pyproxy,
    World,
    manifest_objects,
    wait_for,
)

pytestmark = pytest.mark.netns


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


def test_status_counts_connections_per_endpoint(world: World, proxy: Pyproxy) -> None:
    from pyproxy.backends.xtables.counters import parse

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
