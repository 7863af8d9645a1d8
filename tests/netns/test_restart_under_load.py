"""pyproxy killed with SIGKILL and started again while a client opens 100 connections a
second to a service: the rules stay in the kernel meanwhile and the new process's full sync
replaces them atomically, so no connection fails (in each mode that writes kernel rules). In
ebpf mode the client is a pod in the programs' cgroup: the pinned programs and maps serve it
while no pyproxy runs, and the new process adopts them."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import HERE, PYTHON, Pyproxy, SyncCounts, World, manifest_objects, total

pytestmark = pytest.mark.netns
PYPROXY_MODES = ("iptables", "nftables", "ebpf")
COUNT, INTERVAL = 1000, 0.01  # about 100 a second for 10 s, then the probe ends by itself


def test_sigkill_and_restart_lose_no_connection(world: World, proxy: Pyproxy) -> None:
    proxy.write("k", *manifest_objects(world, svc("k", "10.96.8.1", [HTTP]), pods(world, 1, 2),
                                       HTTP_EP))  # fmt: skip
    reachable(world, "10.96.8.1")
    sockets = world.sockets  # ebpf mode: a pod balanced at its socket
    if sockets:
        world.exec(world.node, "conntrack", "-F", check=False)  # reachable()'s, via the rules
    client = world.spawn(
        world.ns_of(world.pods[2]) if sockets else world.client(0),
        PYTHON, str(HERE / "probe.py"), "tcp", "10.96.8.1", "80",
        "--count", str(COUNT), "--interval", str(INTERVAL), "--timeout", "2",
        prefix=sockets.join() if sockets else (),
    )  # fmt: skip
    time.sleep(1.0)  # a second of load before the kill (the scenario, not a wait on pyproxy)
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGKILL)
    proxy.proc.wait(10)
    proxy.start()  # a new process: its /debug/state counts from zero
    proxy.wait_syncs(SyncCounts(), full=True, timeout=30, what="the restarted pyproxy's full sync")
    assert client.poll() is None, "the client must still be connecting when the sync lands"
    out, _ = client.communicate(timeout=COUNT * INTERVAL + 60)
    result = json.loads(out)
    assert result["errors"] == {} and total(result) == COUNT, result
    assert set(result["replies"]) == {"pod-1", "pod-2"}
    if sockets:  # none of the thousand was addressed to the service on the wire
        listed = world.exec(world.node, "conntrack", "-L", "--orig-dst", "10.96.8.1",
                            check=False).stdout  # fmt: skip
        assert not [ln for ln in listed.splitlines() if ln.startswith("tcp")], listed
