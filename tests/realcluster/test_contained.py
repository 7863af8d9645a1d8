"""Upstream's network suite addresses public and documentation addresses (the ExternalIP test's
203.0.113.250, say). In this cluster a packet to such an address that no proxy rule takes must
die inside the cluster's own namespaces, never reach the machine's: the machine's namespace
holds no link into the cluster, the lan namespace (the nodes' only router) has no route to
them, and packets sent there from a node are counted as unroutable by the lan's kernel."""

from __future__ import annotations

import json

import pytest

from tests.cluster import family, host, real

# Documentation addresses (RFC 5737, RFC 3849), as upstream's tests use them.
OUTSIDE = {4: "203.0.113.250", 6: "2001:db8::250"}
COUNTER = {4: "IpExtInNoRoutes", 6: "Ip6InNoRoutes"}
PACKETS = 5


def _counter(name: str) -> int:
    """A counter of the lan namespace's kernel (absolute, without nstat's history file)."""
    out = host.run("nstat", "-asz", name, ns=real.LAN)
    (value,) = [int(line.split()[1]) for line in out.splitlines() if line.startswith(name)]
    return value


def _versions() -> list[int]:
    return [6 if s.ipv6 else 4 for s in family.stacks(real.family())]


def test_no_link_from_the_machine_into_the_cluster(cluster: dict[str, str]) -> None:
    ids = {
        n["id"]
        for n in json.loads(host.run("ip", "-j", "netns", "list") or "[]")
        if n["name"].startswith(host.PREFIX) and "id" in n
    }
    links = json.loads(host.run("ip", "-j", "link"))
    assert [link["ifname"] for link in links if link.get("link_netnsid") in ids] == []


def test_a_packet_to_an_outside_address_dies_in_the_lan(cluster: dict[str, str]) -> None:
    for v in _versions():
        dst = OUTSIDE[v]
        with pytest.raises(RuntimeError, match="unreachable"):
            host.run("ip", f"-{v}", "route", "get", dst, ns=real.LAN)
        before = _counter(COUNTER[v])
        # A bounded burst of UDP from node-a's namespace, which routes it to the lan.
        send = (
            "import socket,sys\n"
            f"s=socket.socket(socket.AF_INET{'6' if v == 6 else ''},socket.SOCK_DGRAM)\n"
            f"[s.sendto(b'x',(sys.argv[1],9)) for _ in range({PACKETS})]\n"
        )
        host.run("python3", "-c", send, dst, ns=host.PREFIX + "node-a")
        real.wait(
            lambda v=v, before=before: _counter(COUNTER[v]) - before >= PACKETS,
            f"the lan to count {PACKETS} unroutable packets to {dst}",
            10,
            0.2,
        )
