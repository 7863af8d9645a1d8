"""userspace mode with real packets: the relay in pyproxy, REDIRECT rules in the node."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.netns.scrape import check_mode_families, metric, scrape
from tests.netns.services import DNS, DNS_EP, HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    NODE_CLIENT_IP,
    PYPROXY,
    PYTHON,
    Held,
    Pyproxy,
    World,
    manifest_objects,
    names_in,
    total,
    wait_for,
)

pytestmark = pytest.mark.netns
PYPROXY_MODE = "userspace"
PYPROXY_FLAGS = ("--metrics-bind-address", "127.0.0.1:10249")


def test_tcp_and_udp_round_robin_via_cluster_ip_and_node_port(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "rr",
        *manifest_objects(
            world,
            svc(
                "rr",
                "10.96.8.1",
                [{**HTTP, "nodePort": 30280}, {**DNS, "nodePort": 30253}],
                type="NodePort",
            ),
            pods(world, 1, 2, 3),
            HTTP_EP + DNS_EP,
        ),
    )
    reachable(world, "10.96.8.1")
    assert world.probe("tcp", "10.96.8.1", 80, count=30)["replies"] == {
        "pod-1": 10,
        "pod-2": 10,
        "pod-3": 10,
    }  # round robin: each in turn
    np = world.probe("tcp", NODE_CLIENT_IP, 30280, count=30)
    assert names_in(np) == {"pod-1", "pod-2", "pod-3"} and total(np) == 30
    udp = world.probe("udp", "10.96.8.1", 53, count=30)
    assert udp["replies"] == {"pod-1": 10, "pod-2": 10, "pod-3": 10}
    assert names_in(world.probe("udp", NODE_CLIENT_IP, 30253, count=30)) == {
        "pod-1",
        "pod-2",
        "pod-3",
    }
    assert "REDIRECT --to-ports" in world.iptables_save("nat")


def test_affinity_pins(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "aff",
        *manifest_objects(
            world,
            svc("aff", "10.96.8.2", [HTTP], sessionAffinity="ClientIP"),
            pods(world, 1, 2, 3),
            HTTP_EP,
        ),
    )
    reachable(world, "10.96.8.2")
    r = world.probe("tcp", "10.96.8.2", 80, count=20)
    assert len(r["replies"]) == 1 and total(r) == 20


def test_dead_endpoint_is_skipped_after_connect_timeout(world: World, proxy: Pyproxy) -> None:
    objs = manifest_objects(world, svc("dead", "10.96.8.3", [HTTP]), pods(world, 1), HTTP_EP)
    # an endpoint that never answers (no such host on the pod network) and one that refuses
    objs[1]["endpoints"] += [
        {"addresses": ["10.244.1.99"], "conditions": {"ready": True}},
        {"addresses": [world.pods[3].ip], "conditions": {"ready": True}},
    ]
    objs[1]["ports"] = [{"name": "http", "port": 8080, "protocol": "TCP"}]
    proxy.write("dead", *objs)
    reachable(world, "10.96.8.3")
    world.exec(
        world.ns_of(world.pods[3]),
        "iptables-nft",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        "8080",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    )
    r = world.probe("tcp", "10.96.8.3", 80, count=9, timeout=5)
    assert r["replies"] == {"pod-1": 9} and r["errors"] == {}  # every try ends on pod-1


BIG = 40 * 1024 * 1024


def rss_kb(world: World, proxy: Pyproxy) -> int:
    assert proxy.proc is not None
    pid = int(world.exec(world.node, "pgrep", "-n", "-f", "pyproxy --mode userspace").stdout)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


SLOW_READER = r"""
import hashlib, socket, sys, time
s = socket.create_connection((sys.argv[1], 80), timeout=30)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
f = s.makefile("rwb")
f.readline()
f.write(b"GEN %d\n" % int(sys.argv[2])); f.flush()
h = hashlib.sha256(); n = 0; t0 = time.monotonic()
while True:
    chunk = f.read1(65536)
    if not chunk:
        break
    h.update(chunk); n += len(chunk)
    if n < 8 * 1024 * 1024:
        time.sleep(0.002)  # a slow client for the first 8 MB
print(n, h.hexdigest())
"""


def test_large_transfer_intact_with_bounded_memory(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "bulk", *manifest_objects(world, svc("bulk", "10.96.8.4", [HTTP]), pods(world, 2), HTTP_EP)
    )
    reachable(world, "10.96.8.4")
    before = rss_kb(world, proxy)
    out = world.exec(
        world.client(0), PYTHON, "-c", SLOW_READER, "10.96.8.4", str(BIG), timeout=120
    ).stdout.split()
    block = bytes(range(256)) * 256
    expected = hashlib.sha256(block * (BIG // len(block))).hexdigest()
    assert out == [str(BIG), expected]
    # upload: the server checks the hash
    up = world.exec(
        world.client(0), PYTHON, "-c", UPLOAD, "10.96.8.4", str(BIG), timeout=120
    ).stdout.split()
    assert up == ["pod-2", expected]
    grew = rss_kb(world, proxy) - before
    assert grew < 30 * 1024, f"pyproxy grew by {grew} kB while relaying {BIG >> 20} MB"


UPLOAD = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], 80), timeout=30)
f = s.makefile("rwb")
f.readline()
n = int(sys.argv[2])
f.write(b"SHA %d\n" % n)
block = bytes(range(256)) * 256
for _ in range(n // len(block)):
    f.write(block)
f.flush()
s.shutdown(socket.SHUT_WR)   # half-close: the answer must still come back
print(f.readline().decode().strip())
"""


def test_endpoint_removed_mid_connection_keeps_it(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "mid", *manifest_objects(world, svc("mid", "10.96.8.5", [HTTP]), pods(world, 1), HTTP_EP)
    )
    reachable(world, "10.96.8.5")
    held = Held(world, world.client(0), "10.96.8.5", 80)
    assert held.pod == "pod-1"
    before = proxy.syncs()
    proxy.write(
        "mid", *manifest_objects(world, svc("mid", "10.96.8.5", [HTTP]), pods(world, 2), HTTP_EP)
    )
    wait_for(lambda: proxy.syncs() > before, what="a sync")
    assert world.probe("tcp", "10.96.8.5", 80, count=5)["replies"] == {"pod-2": 5}
    assert held.say("still") == ["pod-1", "still"]
    held.close()


def test_no_endpoints_refused(world: World, proxy: Pyproxy) -> None:
    proxy.write("none", svc("none", "10.96.8.6", [HTTP]))
    wait_for(
        lambda: "t/none:http has no endpoints" in world.iptables_save("filter"),
        what="the REJECT rule",
    )
    assert world.probe("tcp", "10.96.8.6", 80, count=3, timeout=3)["errors"] == {"refused": 3}


def test_metric_families_are_the_modes_own(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "mf", *manifest_objects(world, svc("mf", "10.96.8.9", [HTTP]), pods(world, 1), HTTP_EP)
    )
    reachable(world, "10.96.8.9")
    text = scrape(world)
    check_mode_families(text, "userspace")
    listeners = metric(text, "pyproxy_userspace_listeners")
    assert listeners >= 1
    proxy.remove("mf")
    wait_for(
        lambda: metric(scrape(world), "pyproxy_userspace_listeners") == listeners - 1,
        what="the listener count to drop",
    )


def test_cleanup_leaves_no_rule(world: World, proxy: Pyproxy) -> None:
    proxy.stop()
    assert world.exec(world.node, PYPROXY, "cleanup", "--mode=userspace").returncode == 0
    for table in ("nat", "filter"):
        assert "KUBE-" not in world.iptables_save(table)
