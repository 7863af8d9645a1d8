"""ebpf mode's socket balancing, rendered: which service addresses a process on the node is
connected straight to an endpoint for, and to which endpoints (upstream's choice for traffic
that starts on the node), and the map entries' bytes in ``bpf/sock_lb.c``'s layout, written
out by hand from its structs."""

from __future__ import annotations

import ipaddress
import struct
import sys
from pathlib import Path

import pytest

from pyproxy.backends.ebpf import layout
from pyproxy.backends.ebpf.render import Balanced, render_port
from pyproxy.kernel.bpf import possible_cpus
from pyproxy.model.types import (
    Endpoint,
    IPFamily,
    NamespacedName,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortName,
)

ip = ipaddress.ip_address
NODE = NodeInfo("node-a")
NAME = ServicePortName(NamespacedName("ns1", "svc1"), "p80", Protocol.TCP)
HERE = Endpoint(ip("10.180.0.1"), 8080, node_name="node-a")
THERE = Endpoint(ip("10.180.1.1"), 8080, node_name="node-b")


def port(**kw: object) -> ServicePort:
    return ServicePort(NAME, (ip("172.30.0.41"), ip("fd00::41")), 80, **kw)  # type: ignore[arg-type]


def fronts(out: list[Balanced]) -> list[tuple[str, tuple[str, ...]]]:
    return [(str(b.addr), tuple(ep.hostport for ep in b.endpoints)) for b in out]


def test_the_cluster_ip_goes_to_the_internal_policys_endpoints() -> None:
    out = render_port(port(), (HERE, THERE), NODE, IPFamily.IPV4)
    assert fronts(out) == [("172.30.0.41", ("10.180.0.1:8080", "10.180.1.1:8080"))]
    local = render_port(port(internal_policy_local=True), (HERE, THERE), NODE, IPFamily.IPV4)
    assert fronts(local) == [("172.30.0.41", ("10.180.0.1:8080",))]


def test_external_addresses_go_to_the_cluster_endpoints_whatever_the_external_policy() -> None:
    sp = port(external_ips=(ip("203.0.113.1"),), load_balancer_ips=(ip("198.51.100.1"),),
              external_policy_local=True, node_port=30080)  # fmt: skip
    out = render_port(sp, (HERE, THERE), NODE, IPFamily.IPV4)
    both = ("10.180.0.1:8080", "10.180.1.1:8080")
    assert fronts(out) == [("172.30.0.41", both), ("203.0.113.1", both), ("198.51.100.1", both)]


def test_a_nodeport_on_this_nodes_addresses_goes_to_the_cluster_endpoints() -> None:
    """As upstream's external chain for traffic from a pod or the node itself (short-circuited
    to the cluster chain, local policy or not); only the addresses the NodePort serves on,
    from --nodeport-addresses as IPVS mode lists them."""
    from pyproxy.backends.ebpf.table import SocketCache
    from pyproxy.config.settings import ProxyConfig
    from pyproxy.model.nodeports import NodePortAddresses
    from pyproxy.model.types import ProxyState

    def cfg(n: NodePortAddresses) -> ProxyConfig:
        return ProxyConfig(nodeport_addresses=n)

    sp = port(node_port=30080, external_policy_local=True)
    out = render_port(sp, (HERE, THERE), NODE, IPFamily.IPV4, (ip("192.0.2.10"),))
    both = ("10.180.0.1:8080", "10.180.1.1:8080")
    assert [(str(b.addr), b.port, tuple(e.hostport for e in b.endpoints)) for b in out] == [
        ("172.30.0.41", 80, both),
        ("192.0.2.10", 30080, both),
    ]
    assert fronts(render_port(port(), (HERE,), NODE, IPFamily.IPV4, (ip("192.0.2.10"),))) == [
        ("172.30.0.41", ("10.180.0.1:8080",))
    ]  # no NodePort: nothing on the node's address
    node = NodeInfo("node-a", addresses=(ip("192.0.2.10"), ip("198.51.100.7"), ip("fd00::a")),
                    local_addresses=(ip("192.0.2.10"), ip("198.51.100.7"), ip("127.0.0.1"),
                                     ip("fe80::1"), ip("fd00::a")))  # fmt: skip
    primary = SocketCache(IPFamily.IPV4, cfg(NodePortAddresses(primary=True)))
    every = SocketCache(IPFamily.IPV4, cfg(NodePortAddresses()))
    six = SocketCache(IPFamily.IPV6, cfg(NodePortAddresses()))
    state = ProxyState(services={}, endpoints={}, node=node)
    assert primary.facts(state, 0).nodeport_ips == (ip("192.0.2.10"),)
    assert every.facts(state, 0).nodeport_ips == (ip("192.0.2.10"), ip("198.51.100.7"))
    assert six.facts(state, 0).nodeport_ips == (ip("fd00::a"),)  # not loopback, not link-local


def test_clientip_affinity_is_left_to_the_rules_unless_asked() -> None:
    """The rules keep affinity in sets the programs cannot read: a client whose first
    connection met the rules (made before the entry was written) would be given another
    endpoint by the program next (upstream's conformance test of it failed that way once)."""
    sp = port(session_affinity_client_ip=True, sticky_max_age_seconds=60)
    assert render_port(sp, (HERE, THERE), NODE, IPFamily.IPV4) == []
    (b,) = render_port(sp, (HERE, THERE), NODE, IPFamily.IPV4, affinity=True)
    assert b.affinity_timeout == 60 and len(b.members()) == 2


def test_what_is_left_to_the_rules() -> None:
    """No usable endpoint (the rules refuse or drop), source ranges (the rules check them),
    SCTP, and a family without a cluster IP."""
    assert render_port(port(), (), NODE, IPFamily.IPV4) == []
    assert render_port(port(internal_policy_local=True), (THERE,), NODE, IPFamily.IPV4) == []
    ranged = port(load_balancer_ips=(ip("198.51.100.1"),),
                  load_balancer_source_ranges=(ipaddress.ip_network("192.0.2.0/24"),))  # fmt: skip
    assert fronts(render_port(ranged, (HERE,), NODE, IPFamily.IPV4)) == [
        ("172.30.0.41", ("10.180.0.1:8080",))
    ]
    sctp = ServicePort(
        ServicePortName(NAME.service, "p80", Protocol.SCTP), (ip("172.30.0.41"),), 80
    )
    assert render_port(sctp, (HERE,), NODE, IPFamily.IPV4) == []
    v4_only = ServicePort(NAME, (ip("172.30.0.41"),), 80)
    assert render_port(v4_only, (HERE,), NODE, IPFamily.IPV6) == []


def test_the_entries_bytes_are_the_programs_layout() -> None:
    b = Balanced(ip("172.30.0.41"), 80, Protocol.TCP, "ns1/svc1:p80", (HERE,), 10800)
    mapped = b"\0" * 10 + b"\xff\xff" + bytes([172, 30, 0, 41])
    head_key = mapped + b"\x00\x50" + b"\x06\x00" + struct.pack("=I", 0)
    ep_key = mapped + b"\x00\x50" + b"\x06\x00" + struct.pack("=I", 1)
    head = bytes(16) + b"\0\0" + struct.pack("=HIII", 1, 1, 10800, b.ident)
    ep = b"\0" * 10 + b"\xff\xff" + bytes([10, 180, 0, 1]) + b"\x1f\x90" + bytes(14)
    assert b.entries() == {head_key: head, ep_key: ep}
    assert len(head_key) == layout.KEY_SIZE and len(head) == layout.VALUE_SIZE
    v6 = layout.key(ip("fd00::41"), 53, Protocol.UDP, 2)
    assert v6 == ip("fd00::41").packed + b"\x00\x35" + b"\x11\x00" + struct.pack("=I", 2)


def test_render_text_names_address_service_and_endpoints() -> None:
    eps = (Endpoint(ip("fd00:180::1"), 53), Endpoint(ip("fd00:180::2"), 53))
    b = Balanced(ip("fd00::41"), 80, Protocol.UDP, "ns1/svc1:p80", eps, 10800)
    assert (
        b.text
        == "[fd00::41]:80/udp ns1/svc1:p80 affinity 10800s -> [fd00:180::1]:53 [fd00:180::2]:53"
    )


@pytest.mark.parametrize(("text", "cpus"), [("0\n", 1), ("0-1\n", 2), ("0,2-5\n", 5)])
def test_per_cpu_values_are_one_per_possible_cpu(tmp_path: Path, text: str, cpus: int) -> None:
    """The kernel copies a per-CPU map's value for each possible CPU (a list of ranges, with
    holes on some machines); the counts are their sum."""
    f = tmp_path / "possible"
    f.write_text(text)
    assert possible_cpus(str(f)) == cpus
    values = [n.to_bytes(8, sys.byteorder) for n in (3, 0, 4)]
    assert layout.total(values) == 7
    assert layout.count_key(0xDEADBEEF) == (0xDEADBEEF).to_bytes(4, sys.byteorder)
