"""The node's addresses as IPVS mode reads them: every link's but kube-ipvs0's, which holds
one address per service and must not be read on every sync. A veth stands in for it here
(this machine has no dummy interfaces)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator

import pytest

from pyproxy.kernel.addresses import local_addresses
from tests.cluster.nsrelay import netns
from tests.netns.world import sh

NS = f"pp-addrs-{os.getpid()}"


@pytest.fixture
def ns() -> Iterator[str]:
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "-n", NS, "link", "set", "lo", "up")
        sh("ip", "-n", NS, "link", "add", "svcs0", "type", "veth", "peer", "name", "node0")
        sh("ip", "-n", NS, "addr", "add", "172.31.5.1/24", "dev", "node0")
        sh("ip", "-n", NS, "addr", "add", "fd00:5::1/64", "dev", "node0", "nodad")
        batch = "".join(f"addr add 10.96.{i // 256}.{i % 256}/32 dev svcs0\n" for i in range(600))
        sh("ip", "-n", NS, "-batch", "-", input=batch)
        yield NS
    finally:
        sh("ip", "netns", "del", NS, check=False)


def test_excluding_a_link_leaves_exactly_the_other_links_addresses(ns: str) -> None:
    with netns(f"/run/netns/{ns}"):
        everything = local_addresses()
        node = local_addresses(exclude_links=("svcs0",))
    want = {"127.0.0.1", "::1", "172.31.5.1", "fd00:5::1"}
    assert {str(a) for a in node} - {str(a) for a in node if a.is_link_local} == want
    assert len(everything) == len(node) + 600
    assert ipaddress.ip_address("10.96.0.7") in everything
    assert ipaddress.ip_address("10.96.0.7") not in node
