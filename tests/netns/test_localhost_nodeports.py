"""nftables mode with ``--nodeport-addresses primary,localhost`` (upstream v1.37's localhost
NodePorts, KEP-6032): TCP NodePorts answer on 127.0.0.1 and ::1 through pyproxy's relay, UDP
ones are rejected and counted by the table, listeners follow the endpoints, and a port another
program holds costs only its own listener."""

from __future__ import annotations

import subprocess

import pytest

from tests.netns.scrape import metric, scrape
from tests.netns.services import DNS, DNS_EP, HTTP, HTTP_EP, pods, svc
from tests.netns.world import PYTHON, Pyproxy, World, manifest_objects, names_in, total, wait_for

pytestmark = pytest.mark.netns
PYPROXY_MODE = "nftables"
PYPROXY_FLAGS = (
    "--nodeport-addresses", "primary,localhost",
    "--metrics-bind-address", "127.0.0.1:10249",
)  # fmt: skip
LISTENERS = "kubeproxy_nftables_localhost_nodeport_listeners"
REJECTED = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total"
FAILURES = "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total"
V4, V6 = '{ip_family="IPv4"}', '{ip_family="IPv6"}'


def dual(world: World, name: str, ip: str, ip6: str, tcp: int, udp: int, *idx: int) -> list:
    spec = svc(
        name, ip, [{**HTTP, "nodePort": tcp}, {**DNS, "nodePort": udp}], type="NodePort",
        clusterIPs=[ip, ip6], ipFamilies=["IPv4", "IPv6"], ipFamilyPolicy="RequireDualStack",
    )  # fmt: skip
    return manifest_objects(world, spec, pods(world, *idx), HTTP_EP + DNS_EP, ipv6=True)


def answers(world: World, host: str, port: int) -> bool:
    return bool(world.probe("tcp", host, port, count=1, timeout=1.0, ns=world.node)["replies"])


def test_tcp_served_on_loopback_udp_rejected_and_counted(world: World, proxy: Pyproxy) -> None:
    proxy.write("lo", *dual(world, "lo", "10.96.7.1", "fd00:96::7:1", 30181, 30153, 1, 2))
    wait_for(lambda: answers(world, "127.0.0.1", 30181), what="127.0.0.1:30181 to answer")
    for host in ("127.0.0.1", "::1"):
        r = world.probe("tcp", host, 30181, count=20, ns=world.node)
        assert names_in(r) == {"pod-1", "pod-2"} and total(r) == 20, (host, r)
    text = scrape(world)
    assert metric(text, LISTENERS, V4) == 1 and metric(text, LISTENERS, V6) == 1
    before = metric(text, REJECTED, '{ip_family="IPv4",protocol="UDP"}')
    r = world.probe("udp", "127.0.0.1", 30153, count=3, timeout=0.5, ns=world.node)
    assert total(r) == 0
    after = metric(scrape(world), REJECTED, '{ip_family="IPv4",protocol="UDP"}')
    assert after - before == 3  # the table's reject rule, not just a closed port
    table = world.exec(world.node, "nft", "list", "map", "ip", "kube-proxy",
                       "localhost-nodeport-reject-ports").stdout  # fmt: skip
    assert "udp . 30153 : goto localhost-nodeport-reject-udp" in table
    assert "tcp . 30181" not in table


def test_listeners_follow_the_endpoints(world: World, proxy: Pyproxy) -> None:
    proxy.write("lo2", *dual(world, "lo2", "10.96.7.2", "fd00:96::7:2", 30182, 30154, 1))
    wait_for(lambda: answers(world, "127.0.0.1", 30182), what="127.0.0.1:30182 to answer")
    assert names_in(world.probe("tcp", "127.0.0.1", 30182, count=5, ns=world.node)) == {"pod-1"}
    proxy.write("lo2", *dual(world, "lo2", "10.96.7.2", "fd00:96::7:2", 30182, 30154, 2))
    wait_for(
        lambda: (
            names_in(world.probe("tcp", "127.0.0.1", 30182, count=3, ns=world.node)) == {"pod-2"}
        ),
        what="the listener to follow the new endpoint",
    )
    proxy.write("lo2", *dual(world, "lo2", "10.96.7.2", "fd00:96::7:2", 30182, 30154))
    wait_for(
        lambda: (
            world.probe("tcp", "127.0.0.1", 30182, count=1, ns=world.node)["errors"]
            == {"refused": 1}
        ),
        what="no listener without endpoints",
    )


def test_a_taken_port_fails_only_its_listener(world: World, proxy: Pyproxy) -> None:
    squatter = world.spawn(
        world.node, PYTHON, "-c",
        "import socket, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 30183)); s.listen()\n"
        "print('ready', flush=True); time.sleep(120)",
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
        failures = metric(scrape(world), FAILURES, V4)
        proxy.write("taken", *dual(world, "taken", "10.96.7.3", "fd00:96::7:3", 30183, 30155, 1))
        proxy.write("free", *dual(world, "free", "10.96.7.4", "fd00:96::7:4", 30184, 30156, 2))
        wait_for(lambda: answers(world, "127.0.0.1", 30184), what="127.0.0.1:30184 to answer")
        wait_for(lambda: metric(scrape(world), FAILURES, V4) > failures, what="a failure count")
        assert answers(world, "::1", 30183)  # the other family's listener is unaffected
    finally:
        world.stop(squatter)
    # Once the port is free (the squatter has exited), a later sync takes it.
    proxy.write("nudge", *dual(world, "nudge", "10.96.7.5", "fd00:96::7:5", 30185, 30157, 1))
    wait_for(lambda: answers(world, "127.0.0.1", 30183), what="the freed port to be served")


def test_restart_without_localhost_removes_its_objects(world: World, proxy: Pyproxy) -> None:
    """The reject map, chains and counters a run with loopback left go at the next run's
    first full sync (upstream's add-then-delete); nothing listens any more."""

    def table() -> str:
        return world.exec(world.node, "nft", "list", "table", "ip", "kube-proxy").stdout

    assert "localhost-nodeport-reject-udp" in table()
    proxy.stop()
    plain = Pyproxy(world, proxy.manifests, proxy.log, mode="nftables").start()
    try:
        wait_for(lambda: "localhost-nodeport" not in table(), what="the objects to go")
        assert "counter localhost-nodeport-rejected" not in table()
        assert world.probe("tcp", "127.0.0.1", 30181, ns=world.node)["errors"] == {"refused": 1}
        assert answers(world, "10.96.7.1", 80)  # the services themselves are still served
    finally:
        plain.stop()
