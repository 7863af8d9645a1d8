"""ebpf mode with real packets: pyproxy attaches its socket programs to a child cgroup the
test made (``SocketCgroup``) and pins them in a bpffs of the test's own. A process in that
cgroup (a pod on the node) is connected straight to an endpoint: the connections succeed and
the node's conntrack holds no entry for the service address, where the same probe from
outside the cgroup goes through nftables mode's rules (an entry per connection, DNATed). The
pinned map follows the service, the programs outlive a SIGKILL, a restart adopts them, and
cleanup detaches and unpins everything. The other checks of nftables mode's rules run in
test_traffic.py; this module shows what the programs add."""

from __future__ import annotations

import ipaddress
import json
import signal
import subprocess

import pytest

from pyproxy.backends.ebpf import layout
from pyproxy.kernel.bpf import AttachType, Map, attached
from pyproxy.model.types import Protocol
from tests.netns.scrape import get
from tests.netns.services import DNS, DNS_EP, HTTP, HTTP_EP, pods, svc
from tests.netns.world import (
    NODE_CLIENT_IP,
    PYPROXY,
    PYTHON,
    Pyproxy,
    SyncCounts,
    World,
    manifest_objects,
    wait_for,
)

pytestmark = pytest.mark.netns
PYPROXY_MODE = "ebpf"
PYPROXY_FLAGS = ("--sync-period", "1h", "--bpf-socket-affinity")
VIP = "10.96.7.1"
DAEMON = "http://127.0.0.1:10249"


def services_map(world: World) -> dict[bytes, bytes]:
    assert world.sockets is not None
    with Map.open(str(world.sockets.pin_dir / "services")) as m:
        return m.items()


def head_count(entries: dict[bytes, bytes], vip: str, port: int = 80,
               proto: Protocol = Protocol.TCP) -> int | None:  # fmt: skip

    value = entries.get(layout.key(ipaddress.ip_address(vip), port, proto, 0))
    return None if value is None else int.from_bytes(value[20:24], "little")


def conntrack_to(world: World, vip: str) -> int:
    """Connections the node's conntrack holds whose original destination is ``vip``."""
    out = world.exec(world.node, "conntrack", "-L", "--orig-dst", vip, check=False)
    return len([line for line in out.stdout.splitlines() if line.startswith(("tcp", "udp"))])


def write_service(world: World, proxy: Pyproxy, before: SyncCounts, *idx: int) -> SyncCounts:
    proxy.write("web", *manifest_objects(world, svc("web", VIP, [HTTP]), pods(world, *idx),
                                         HTTP_EP))  # fmt: skip
    return proxy.wait_programmed(before, what="the web service to be programmed")


def test_a_pod_is_connected_straight_to_an_endpoint(world: World, proxy: Pyproxy) -> None:
    now = proxy.wait_syncs(SyncCounts(), full=True, what="the first full sync")
    write_service(world, proxy, now, 1, 2)
    pod3 = world.ns_of(world.pods[2])
    world.exec(world.node, "conntrack", "-F", check=False)
    r = world.probe("tcp", VIP, 80, count=60, ns=pod3, in_cgroup=True)
    assert r["errors"] == {} and set(r["replies"]) == {"pod-1", "pod-2"}, r
    assert r["sources"] == {"pod-1": [world.pods[2].ip], "pod-2": [world.pods[2].ip]}
    assert conntrack_to(world, VIP) == 0  # never addressed to the service on the wire
    outside = world.probe("tcp", VIP, 80, count=10, ns=pod3)
    assert outside["errors"] == {} and sum(outside["replies"].values()) == 10
    assert conntrack_to(world, VIP) == 10  # the rules' DNAT: one entry per connection


def test_a_nodeport_on_the_nodes_address_is_balanced_at_the_socket(
    world: World, proxy: Pyproxy
) -> None:
    """A pod connecting to its node's address at a NodePort is connected to an endpoint as for
    the ClusterIP (upstream sends it to the cluster's endpoints, local policy or not): no
    conntrack entry for the node's address, the pod's own source kept; outside the cgroup the
    rules translate it."""
    before = proxy.counts()
    proxy.write("np", *manifest_objects(
        world, svc("np", "10.96.7.5", [{**HTTP, "nodePort": 30085}], type="NodePort",
                   externalTrafficPolicy="Local"), pods(world, 1, 2), HTTP_EP))  # fmt: skip
    proxy.wait_programmed(before, what="the NodePort service to be programmed")
    pod3 = world.ns_of(world.pods[2])
    world.exec(world.node, "conntrack", "-F", check=False)
    r = world.probe("tcp", NODE_CLIENT_IP, 30085, count=40, ns=pod3, in_cgroup=True)
    assert r["errors"] == {} and set(r["replies"]) == {"pod-1", "pod-2"}, r
    assert r["sources"] == {"pod-1": [world.pods[2].ip], "pod-2": [world.pods[2].ip]}
    assert conntrack_to(world, NODE_CLIENT_IP) == 0
    outside = world.probe("tcp", NODE_CLIENT_IP, 30085, count=10, ns=pod3)
    assert outside["errors"] == {} and sum(outside["replies"].values()) == 10
    assert conntrack_to(world, NODE_CLIENT_IP) == 10
    proxy.remove("np")


def socket_connections(world: World, name: str) -> int:
    """What the daemon's /debug/traffic says was sent to ``name``'s endpoints."""
    doc = json.loads(get(world, DAEMON + "/debug/traffic")["body"])
    return int(doc.get(name, {}).get("connections", 0))


def test_the_programs_count_the_connections_they_send(world: World, proxy: Pyproxy) -> None:
    """Per service port, summed over the CPUs: exactly the connections the cgroup's
    processes made; a connection through the rules is not the programs' (and without
    --service-metrics the rules count nothing)."""
    vip = "10.96.7.9"
    before_sync = proxy.counts()
    proxy.write("cnt", *manifest_objects(world, svc("cnt", vip, [HTTP]), pods(world, 1, 2),
                                         HTTP_EP))  # fmt: skip
    proxy.wait_programmed(before_sync, what="the cnt service to be programmed")
    pod3 = world.ns_of(world.pods[2])
    assert socket_connections(world, "t/cnt:http") == 0
    r = world.probe("tcp", vip, 80, count=25, ns=pod3, in_cgroup=True)
    assert r["errors"] == {} and sum(r["replies"].values()) == 25, r
    assert socket_connections(world, "t/cnt:http") == 25
    outside = world.probe("tcp", vip, 80, count=5, ns=pod3)
    assert outside["errors"] == {} and sum(outside["replies"].values()) == 5, outside
    assert socket_connections(world, "t/cnt:http") == 25
    gone = proxy.counts()
    proxy.remove("cnt")
    proxy.wait_programmed(gone, what="the cnt service's removal")


def test_the_pinned_map_follows_the_service(world: World, proxy: Pyproxy) -> None:
    now = write_service(world, proxy, proxy.counts(), 1, 2, 4)
    assert head_count(services_map(world), VIP) == 3
    now = write_service(world, proxy, now, 1)
    entries = services_map(world)
    assert head_count(entries, VIP) == 1
    pod3 = world.ns_of(world.pods[2])
    r = world.probe("tcp", VIP, 80, count=20, ns=pod3, in_cgroup=True)
    assert r["replies"] == {"pod-1": 20}, r
    # no endpoints: no entry, and the rules refuse as upstream's do
    write_service(world, proxy, now)
    assert head_count(services_map(world), VIP) is None
    refused = world.probe("tcp", VIP, 80, count=3, ns=pod3, in_cgroup=True)
    assert refused["errors"] == {"refused": 3}, refused


def test_session_affinity_keeps_a_pod_on_one_endpoint(world: World, proxy: Pyproxy) -> None:
    """With --bpf-socket-affinity (this module's flags; by default the rules balance such a
    service, tests/unit/test_ebpf_render.py)."""
    before = proxy.counts()
    sticky = svc("sticky", "10.96.7.2", [HTTP], sessionAffinity="ClientIP")
    proxy.write("sticky", *manifest_objects(world, sticky, pods(world, 1, 2, 4), HTTP_EP))
    now = proxy.wait_programmed(before, what="the sticky service to be programmed")
    pod3 = world.ns_of(world.pods[2])
    world.exec(world.node, "conntrack", "-F", check=False)
    r = world.probe("tcp", "10.96.7.2", 80, count=20, ns=pod3, in_cgroup=True)
    assert r["errors"] == {} and len(r["replies"]) == 1, r
    assert conntrack_to(world, "10.96.7.2") == 0  # the program's affinity (the flag), no rule's
    kept = next(iter(r["replies"]))
    left = [i for i in (1, 2, 4) if f"pod-{i}" != kept]
    proxy.write("sticky", *manifest_objects(world, sticky, pods(world, *left), HTTP_EP))
    proxy.wait_programmed(now, what="the sticky service's endpoint removal")
    r = world.probe("tcp", "10.96.7.2", 80, count=20, ns=pod3, in_cgroup=True)
    assert r["errors"] == {} and len(r["replies"]) == 1 and kept not in r["replies"], r


UDP_CLIENT = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(b"hi", ("{vip}", 53))
data, source = s.recvfrom(200)
print(data.decode().split()[0], source[0], source[1])
"""


def test_udp_replies_come_from_the_service_address(world: World, proxy: Pyproxy) -> None:
    before = proxy.counts()
    proxy.write("dns", *manifest_objects(world, svc("dns", "10.96.7.53", [DNS]),
                                         pods(world, 2), DNS_EP))  # fmt: skip
    proxy.wait_programmed(before, what="the dns service to be programmed")
    pod3 = world.ns_of(world.pods[2])
    out = world.exec(pod3, PYTHON, "-c", UDP_CLIENT.format(vip="10.96.7.53"), in_cgroup=True)
    assert out.stdout.split() == ["pod-2", "10.96.7.53", "53"]
    assert conntrack_to(world, "10.96.7.53") == 0


V6_CLIENT = """
import socket
out = []
s = socket.create_connection(("fd00:96::71", 80), timeout=3)
out.append(s.makefile().readline().split()[0] + "@" + s.getpeername()[0])
u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
u.settimeout(3)
u.sendto(b"hi", ("fd00:96::71", 53))
data, source = u.recvfrom(200)
out.append(data.decode().split()[0] + "@" + source[0])
d = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)  # dual-stack, to the IPv4 address
d.settimeout(3)
d.connect(("::ffff:10.96.7.71", 80))
out.append(d.makefile().readline().split()[0] + "@" + d.getpeername()[0])
print(" ".join(out))
"""


def test_ipv6_and_a_dual_stack_socket(world: World, proxy: Pyproxy) -> None:
    """IPv6 through the *6 programs; an IPv6 socket reaching the IPv4 service by its
    IPv4-mapped address finds the same entry (the map keys IPv4 addresses that way)."""
    before = proxy.counts()
    dual = svc("dual", "10.96.7.71", [HTTP, DNS], clusterIPs=["10.96.7.71", "fd00:96::71"],
               ipFamilies=["IPv4", "IPv6"], ipFamilyPolicy="RequireDualStack")  # fmt: skip
    proxy.write("dual", *manifest_objects(world, dual, pods(world, 4), HTTP_EP + DNS_EP,
                                          ipv6=True))  # fmt: skip
    proxy.wait_programmed(before, what="the dual-stack service to be programmed")
    pod3 = world.ns_of(world.pods[2])
    out = world.exec(pod3, PYTHON, "-c", V6_CLIENT, in_cgroup=True).stdout.split()
    assert out == ["pod-4@fd00:96::71", "pod-4@fd00:96::71", "pod-4@::ffff:10.96.7.71"]
    assert conntrack_to(world, "10.96.7.71") == 0


def test_diff_names_a_map_entry_deleted_by_hand(world: World, proxy: Pyproxy) -> None:
    now = write_service(world, proxy, proxy.counts(), 1)
    assert world.sockets is not None
    slot = layout.key(ipaddress.ip_address(VIP), 80, Protocol.TCP, 1)

    def clean() -> bool:
        res = world.exec(world.node, PYPROXY, "diff", "--from-daemon", DAEMON, check=False)
        return res.returncode == 0

    # an earlier test's stale nftables chains are deleted a second after they were flushed
    wait_for(clean, timeout=10, what="pyproxy diff to find nothing")
    with Map.open(str(world.sockets.pin_dir / "services")) as m:
        assert m.delete(slot)
    res = world.exec(world.node, PYPROXY, "diff", "--from-daemon", DAEMON, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    gone = f"{VIP}:80/tcp slot 1: {world.pods[0].ip}:8080"
    assert res.stdout.splitlines()[:3] == ["service t/web:", "  socket map services",
                                           f"    - {gone}"], res.stdout  # fmt: skip
    write_service(world, proxy, now, 1, 4)  # the service's next change writes it again
    entries = services_map(world)
    assert head_count(entries, VIP) == 2 and slot in entries


CONNECTED_UDP = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
s.connect(("10.96.7.54", 53))
seen = []
for line in sys.stdin:  # one datagram per line the test writes
    try:
        s.send(b"hi")
        seen.append(s.recv(200).decode().split()[0])
    except OSError:
        seen.append("timeout")
    print(seen[-1], flush=True)
"""


def test_a_connected_udp_socket_follows_a_replaced_endpoint(world: World, proxy: Pyproxy) -> None:
    """A connected UDP socket is left to the rules, so the rules' conntrack cleanup moves it
    to the new endpoint as in nftables mode (a socket connected to the endpoint itself would
    keep sending to the old one, which still answers here)."""
    before = proxy.counts()
    proxy.write("cudp", *manifest_objects(world, svc("cudp", "10.96.7.54", [DNS]),
                                          pods(world, 1), DNS_EP))  # fmt: skip
    now = proxy.wait_programmed(before, what="the cudp service to be programmed")
    assert world.sockets is not None
    pod3 = world.ns_of(world.pods[2])
    client = world.spawn(pod3, PYTHON, "-c", CONNECTED_UDP, stdin=subprocess.PIPE,
                         prefix=world.sockets.join())  # fmt: skip
    assert client.stdin is not None and client.stdout is not None

    def ask() -> str:
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write("x\n")
        client.stdin.flush()
        return client.stdout.readline().strip()

    assert ask() == "pod-1"
    assert conntrack_to(world, "10.96.7.54") == 1  # through the rules: DNATed, tracked
    proxy.write("cudp", *manifest_objects(world, svc("cudp", "10.96.7.54", [DNS]),
                                          pods(world, 2), DNS_EP))  # fmt: skip
    proxy.wait_programmed(now, what="the endpoint replacement")
    assert wait_for(lambda: ask() == "pod-2" or None, timeout=5,
                    what="the same connected socket to reach pod-2")  # fmt: skip
    world.stop(client)


HOOKS = (AttachType.CONNECT4, AttachType.SENDMSG4, AttachType.RECVMSG4,
         AttachType.GETPEERNAME4, AttachType.CONNECT6, AttachType.SENDMSG6,
         AttachType.RECVMSG6, AttachType.GETPEERNAME6)  # fmt: skip


def programs(world: World) -> dict[AttachType, list[int]]:
    assert world.sockets is not None
    return {h: attached(str(world.sockets.path), h) for h in HOOKS}


def test_the_programs_outlive_a_sigkill_and_a_restart_adopts_them(
    world: World, proxy: Pyproxy
) -> None:
    write_service(world, proxy, proxy.counts(), 1, 2)  # a change from the last test's state
    before = services_map(world)
    progs = programs(world)
    assert all(len(ids) == 1 for ids in progs.values()), progs
    assert proxy.proc is not None
    world.stop(proxy.proc, sig=signal.SIGKILL)
    proxy.proc = None
    pod3 = world.ns_of(world.pods[2])
    r = world.probe("tcp", VIP, 80, count=20, ns=pod3, in_cgroup=True)
    assert r["errors"] == {} and sum(r["replies"].values()) == 20, r  # served while down
    proxy.start()
    wait_for(lambda: proxy.counts().full >= 1 or None, timeout=30,
             what="the restarted pyproxy's first full sync")  # fmt: skip
    assert services_map(world) == before
    after = programs(world)
    assert all(len(ids) == 1 for ids in after.values()), after  # swapped, not attached twice
    r = world.probe("tcp", VIP, 80, count=20, ns=pod3, in_cgroup=True)
    assert r["errors"] == {} and set(r["replies"]) == {"pod-1", "pod-2"}, r


def test_cleanup_detaches_and_unpins_everything(world: World, proxy: Pyproxy) -> None:
    assert world.sockets is not None
    proxy.stop()
    world.exec(world.node, PYPROXY, "cleanup", "--mode=ebpf", *world.sockets.flags())
    assert not world.sockets.pin_dir.exists()
    assert programs(world) == {h: [] for h in HOOKS}
    tables = world.exec(world.node, "nft", "list", "tables").stdout.splitlines()
    assert "table ip kube-proxy" not in tables


def test_a_start_in_another_mode_removes_the_programs(world: World, proxy: Pyproxy) -> None:
    """Pinned, the programs outlive their process and would go on connecting the cgroup's
    sockets from maps nobody updates, around another mode's rules: a start in another mode
    removes them (Mode.outlives) and its rules serve the cgroup's pods."""
    assert world.sockets is not None
    proxy.start()
    proxy.wait_syncs(SyncCounts(), full=True, what="ebpf mode's first full sync")
    assert all(len(ids) == 1 for ids in programs(world).values())
    proxy.stop()
    other = Pyproxy(world, proxy.manifests, proxy.log.with_name("nftables-after-ebpf.log"),
                    *PYPROXY_FLAGS, *world.sockets.flags(), mode="nftables").start()  # fmt: skip
    try:
        other.wait_syncs(SyncCounts(), full=True, what="nftables mode's first full sync")
        wait_for(lambda: programs(world) == {h: [] for h in HOOKS} or None, timeout=30,
                 what="the socket programs to be detached")  # fmt: skip
        assert not world.sockets.pin_dir.exists()
        world.exec(world.node, "conntrack", "-F", check=False)
        r = world.probe("tcp", VIP, 80, count=10, ns=world.ns_of(world.pods[2]), in_cgroup=True)
        assert r["errors"] == {} and sum(r["replies"].values()) == 10, r
        assert conntrack_to(world, VIP) == 10  # the rules' DNAT, no longer the socket's choice
    finally:
        other.stop()
