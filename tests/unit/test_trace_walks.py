"""The trace walks on rendered rules (pure): the shares a statistic or numgen chain gives,
refusals, and a rule the walk cannot read is an error, never a silent "no match"."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

import pytest

from pyproxy.backends.ebpf.backend import EbpfBackend
from pyproxy.backends.iptables.backend import IptablesBackend
from pyproxy.backends.ipvs.backend import IpvsBackend
from pyproxy.backends.nftables.backend import NftablesBackend
from pyproxy.backends.nftables.rule import Rule as NftRule
from pyproxy.backends.nftables.rule import Verdict
from pyproxy.backends.nftables.walk import Table
from pyproxy.backends.nftables.walk import Walker as NftWalker
from pyproxy.backends.trace import Packet, TraceError
from pyproxy.backends.userspace.backend import UserspaceBackend
from pyproxy.backends.xtables.rule import Match, Module, Rule
from pyproxy.backends.xtables.walk import Walker as XtablesWalker
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.types import Protocol
from tests.helpers import endpoint, endpoint_slice, node, port, service, tracker_with

BACKENDS = (IptablesBackend, NftablesBackend, IpvsBackend, UserspaceBackend, EbpfBackend)
CLIENT = ipaddress.ip_address("203.0.113.7")


def state(n: int) -> object:
    eps = [endpoint(f"10.1.0.{i + 1}", node="n1") for i in range(n)]
    objs = [service("ns", "web", "10.96.0.1", [port("http", 80)])]
    if n:
        objs.append(endpoint_slice("ns", "web", "w", eps, [port("http", 8080)]))
    return tracker_with("n1", *objs).current_state()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.mode)
@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_each_endpoint_gets_an_equal_share(backend: type, n: int) -> None:
    t = backend(ProxyConfig()).trace(state(n), Packet(CLIENT, ipaddress.ip_address("10.96.0.1"),
                                                      80))  # fmt: skip
    assert set(t.endpoints) == {f"10.1.0.{i + 1}:8080" for i in range(n)}
    assert all(abs(p - 1 / n) < 1e-9 for p in t.endpoints.values()), t.endpoints


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.mode)
def test_no_endpoints_is_a_refusal(backend: type) -> None:
    t = backend(ProxyConfig()).trace(state(0), Packet(CLIENT, ipaddress.ip_address("10.96.0.1"),
                                                      80))  # fmt: skip
    assert t.verdicts == {"reject"} and not t.endpoints


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.mode)
def test_another_address_is_not_pyproxys(backend: type) -> None:
    t = backend(ProxyConfig()).trace(state(2), Packet(CLIENT, ipaddress.ip_address("10.96.0.2"),
                                                      80))  # fmt: skip
    assert t.verdicts == {"accept"} and not t.endpoints


def test_an_unknown_iptables_option_is_an_error() -> None:
    rule = Rule("PREROUTING", (Module("physdev"), Match("--physdev-in", "eth0")), "ACCEPT")
    walker = XtablesWalker({"nat": {"PREROUTING": [rule]}}, (), (), "0x4000")
    with pytest.raises(TraceError, match="--physdev-in"):
        walker.walk(Packet(CLIENT, ipaddress.ip_address("10.96.0.1"), 80))


@dataclass(frozen=True)
class Osf:
    """An expression the walk does not know (``osf name Linux``)."""

    @property
    def text(self) -> str:
        return "osf name Linux"


def test_an_unknown_nft_expression_is_an_error() -> None:
    rule = NftRule((Osf(), Verdict("drop")))  # type: ignore[arg-type]
    table = Table({"prerouting": [(-100, "nat-prerouting")]}, {"nat-prerouting": [rule]})
    with pytest.raises(TraceError, match="osf"):
        NftWalker(table, ()).walk(Packet(CLIENT, ipaddress.ip_address("10.96.0.1"), 80))


POD = ipaddress.ip_address("10.244.1.5")
VIP = ipaddress.ip_address("10.96.0.1")


def test_ebpf_a_client_in_the_cluster_is_connected_at_the_socket() -> None:
    """A pod (by --cluster-cidr) or the node itself: the socket program's choice, equal
    shares, no NAT; a client outside the cluster: nftables mode's DNAT."""
    cfg = ProxyConfig(cluster_cidrs=(ipaddress.ip_network("10.244.0.0/16"),))
    st = state(2)
    t = EbpfBackend(cfg).trace(st, Packet(POD, VIP, 80))
    assert t.verdicts == {"socket"}
    assert t.endpoints == {"10.1.0.1:8080": 0.5, "10.1.0.2:8080": 0.5}
    assert [o.steps for o in t.outcomes] == [
        ("connect4 program: services map 10.96.0.1:80/tcp slot 0 (2 endpoints)",
         f"connect4 program: services map 10.96.0.1:80/tcp slot {i}: 10.1.0.{i}:8080")
        for i in (1, 2)
    ]  # fmt: skip
    assert not any(o.masquerade for o in t.outcomes)
    outside = EbpfBackend(cfg).trace(st, Packet(CLIENT, VIP, 80))
    assert outside.verdicts == {"dnat"} and set(outside.endpoints) == set(t.endpoints)
    node = ipaddress.ip_address("192.0.2.10")
    local = replace(st, node=st.node.with_local_addresses((node,)))  # type: ignore[type-var]
    assert EbpfBackend(ProxyConfig()).trace(local, Packet(node, VIP, 80)).verdicts == {"socket"}


def test_ebpf_udp_is_balanced_by_sendmsg_and_says_what_a_connected_socket_does() -> None:
    cfg = ProxyConfig(cluster_cidrs=(ipaddress.ip_network("10.244.0.0/16"),))
    eps = [endpoint("10.1.0.1", node="n1")]
    objs = [service("ns", "dns", "10.96.0.1", [port("dns", 53, "UDP")]),
            endpoint_slice("ns", "dns", "d", eps, [port("dns", 5353, "UDP")])]  # fmt: skip
    t = EbpfBackend(cfg).trace(tracker_with("n1", *objs).current_state(),
                               Packet(POD, VIP, 53, Protocol.UDP))  # fmt: skip
    (o,) = t.outcomes
    assert (o.verdict, o.endpoint, o.probability) == ("socket", "10.1.0.1:5353", 1.0)
    assert o.steps[0] == "sendmsg4 program: services map 10.96.0.1:53/udp slot 0 (1 endpoint)"
    assert ("an unconnected UDP socket keeps its endpoint for its life; a connect()ed one is "
            "left to the rules") in o.notes  # fmt: skip


def test_ebpf_a_nodeport_on_the_nodes_address_is_connected_at_the_socket() -> None:
    """From a pod to its node's primary address at a NodePort: the socket program, to the
    cluster's endpoints; from outside: nftables mode's rules."""
    cfg = ProxyConfig(cluster_cidrs=(ipaddress.ip_network("10.244.0.0/16"),))
    from pyproxy.backends.ebpf.mode import MODE

    cfg = replace(cfg, nodeport_addresses=MODE.nodeport_default)
    eps = [endpoint("10.1.0.1", node="n1"), endpoint("10.1.0.2", node="n2")]
    objs = [node("n1", addresses=["192.0.2.10"]),
            service("ns", "web", "10.96.0.1", [port("http", 80, nodePort=30080)],
                    type="NodePort", externalTrafficPolicy="Local"),
            endpoint_slice("ns", "web", "w", eps, [port("http", 8080)])]  # fmt: skip
    st = tracker_with("n1", *objs).current_state()
    addr = ipaddress.ip_address("192.0.2.10")
    t = EbpfBackend(cfg).trace(st, Packet(POD, addr, 30080))
    assert t.verdicts == {"socket"}
    assert t.endpoints == {"10.1.0.1:8080": 0.5, "10.1.0.2:8080": 0.5}
    assert t.outcomes[0].steps[0] == (
        "connect4 program: services map 192.0.2.10:30080/tcp slot 0 (2 endpoints)"
    )
    outside = EbpfBackend(cfg).trace(st, Packet(CLIENT, addr, 30080))
    assert "socket" not in outside.verdicts
