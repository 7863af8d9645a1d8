"""Runs last (file order): ``down`` leaves the machine as it was. Its addresses, routes and
rules (iptables of both back ends, nftables), the host-wide sysctls the kubelet writes
(masked in the cluster's mount namespace) and ip_forward are what they were before the
cluster came up, and no namespace, cgroup or state directory of the cluster is left."""

from __future__ import annotations

from pathlib import Path

from tests.cluster import host, real


def test_down_leaves_the_machine_as_it_was(cluster: dict[str, str]) -> None:
    real.down()
    after = host.machine_facts()
    assert after == cluster
    assert not host.netns_names()
    assert not [c for c in Path("/sys/fs/cgroup").glob(f"*/{host.PREFIX}*")]
    assert not real.STATE.exists()
