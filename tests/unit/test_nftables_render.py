"""nftables rules compared with upstream kube-proxy v1.36.3's own expected output, the way
upstream compares them (objects sorted by kind and name, rules kept in order)."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from pyproxy.backends.nftables import names
from pyproxy.backends.nftables.localhost import service_listeners
from pyproxy.backends.nftables.render import NftConfig
from pyproxy.backends.nftables.table import render
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.nodeports import NodePortAddresses
from pyproxy.model.types import (
    Endpoint,
    IPFamily,
    NamespacedName,
    Protocol,
    ProxyState,
    ServicePortName,
)
from tests.helpers import endpoint, endpoint_slice, node, port, service, tracker_with
from tests.unit.nftables_golden import BASE_RULES, LOCALHOST_REJECT_UDP, OVERALL, sort_transaction

NODE = "test-node"
ip = ipaddress.ip_address
net = ipaddress.ip_network
# Upstream's NewFakeProxier: pod CIDR 10.0.0.0/8, service CIDR 172.30.0.0/16, NodePorts on
# 192.168.0.2/32 and 2001:db8::1/128, node IP 192.168.0.2, these interface addresses:
CFG = NftConfig(
    proxy=ProxyConfig(
        mode="nftables",
        cluster_cidrs=(net("10.0.0.0/8"),),
        nodeport_addresses=NodePortAddresses(cidrs=(net("192.168.0.2/32"), net("2001:db8::1/128"))),
    )
)
LOCAL = tuple(ip(a) for a in ("127.0.0.1", "::1", "192.168.0.2", "192.168.1.2", "192.168.99.11",
                               "2001:db8::1", "2001:db8:1::2"))  # fmt: skip
SERVICE_CIDR = {
    "kind": "ServiceCIDR",
    "metadata": {"name": "kubernetes"},
    "spec": {"cidrs": ["172.30.0.0/16"]},
}


def state_of(*objs: dict) -> ProxyState:
    st = tracker_with(NODE, node(NODE, addresses=["192.168.0.2"]), SERVICE_CIDR, *objs)
    s = st.current_state()
    return replace(s, node=s.node.with_local_addresses(LOCAL))


def overall_objects() -> list[dict]:
    p80 = [port("p80", 80)]
    lb2 = {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}
    lb5 = {"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}}
    return [
        service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
        service("ns2", "svc2", "172.30.0.42", [port("p80", 80, nodePort=3001)],
                type="LoadBalancer", externalTrafficPolicy="Local",
                externalIPs=["192.168.99.22"], healthCheckNodePort=30000, status=lb2),
        service("ns3", "svc3", "172.30.0.43", [port("p80", 80, nodePort=3003)], type="NodePort"),
        service("ns4", "svc4", "172.30.0.44", [port("p80", 80, targetPort=80)], type="NodePort",
                externalIPs=["192.168.99.33"]),
        service("ns5", "svc5", "172.30.0.45", [port("p80", 80, nodePort=3002)],
                type="LoadBalancer", externalTrafficPolicy="Cluster", healthCheckNodePort=30000,
                loadBalancerSourceRanges=[" 203.0.113.0/25"], sessionAffinity="ClientIP",
                sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}}, status=lb5),
        service("ns6", "svc6", "172.30.0.46", [port("p80", 80, targetPort=80)], type="ClusterIP"),
        endpoint_slice("ns1", "svc1", "svc1-1", [endpoint("10.180.0.1", node=NODE)], p80),
        endpoint_slice("ns2", "svc2", "svc2-1", [endpoint("10.180.0.2", node="other-node")], p80),
        endpoint_slice("ns3", "svc3", "svc3-1", [endpoint("10.180.0.3", node=NODE)], p80),
        endpoint_slice("ns4", "svc4", "svc4-1", [endpoint("10.180.0.4", node="other-node"),
                                                  endpoint("10.180.0.5", node=NODE)], p80),
        endpoint_slice("ns5", "svc5", "svc5-1", [endpoint("10.180.0.3", node=NODE)], p80),
    ]  # fmt: skip


def test_overall_rules_match_upstream() -> None:
    got = render(state_of(*overall_objects()), CFG).dump()
    assert sort_transaction(got) == sort_transaction(BASE_RULES + OVERALL)


def test_names_are_upstreams_hashes() -> None:
    spn = ServicePortName(NamespacedName("ns1", "svc1"), "p80", Protocol.TCP)
    assert names.port_base(spn) == "ULMVA6XW-ns1/svc1/tcp/p80"
    ep = Endpoint(ip("10.180.0.1"), 80)
    assert names.endpoint_base(spn, ep) == "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    spn4 = ServicePortName(NamespacedName("ns4", "svc4"), "p80", Protocol.TCP)
    assert names.endpoint_base(spn4, Endpoint(ip("10.180.0.5"), 80)).startswith("5RFCDDV7-")


# ---- localhost NodePorts (upstream v1.37, KEP-6032) ----------------------------------------

LOOPBACK_CFG = replace(
    CFG,
    proxy=replace(CFG.proxy, nodeport_addresses=NodePortAddresses(cidrs=(net("127.0.0.0/8"),))),
)


def test_localhost_nodeports_reject_what_the_relay_cannot_serve() -> None:
    """Upstream v1.37.2's TestLocalhostNodePortReject: with the localhost proxy on, UDP and
    SCTP NodePorts on loopback are counted and rejected, TCP is left to the proxy."""
    udp = service("ns1", "svc-udp", "172.30.0.42", [port("p53", 53, "UDP", nodePort=30053)],
                  type="NodePort")  # fmt: skip
    tcp = service("ns1", "svc-tcp", "172.30.0.43", [port("p80", 80, nodePort=30080)],
                  type="NodePort")  # fmt: skip
    lines = set(render(state_of(udp, tcp), LOOPBACK_CFG).dump().splitlines())
    for want in LOCALHOST_REJECT_UDP:
        assert want in lines
    assert not any("localhost-nodeport-rejected-tcp" in ln for ln in lines)
    assert not any("tcp . 30080 : goto localhost" in ln for ln in lines)
    # The other family names no loopback: its table has none of it.
    v6 = replace(LOOPBACK_CFG, family=IPFamily.IPV6)
    assert not any("localhost" in ln for ln in render(state_of(udp, tcp), v6).dump().splitlines())


def test_localhost_listeners_follow_the_external_policy() -> None:
    here, there = endpoint("10.180.0.1", node=NODE), endpoint("10.180.0.2", node="other")
    objs = [
        service("ns", "local", "172.30.0.50", [port("p80", 80, nodePort=30050)],
                type="NodePort", externalTrafficPolicy="Local", healthCheckNodePort=30001),
        service("ns", "cluster", "172.30.0.51", [port("p80", 80, nodePort=30051)],
                type="NodePort", sessionAffinity="ClientIP"),
        service("ns", "dns", "172.30.0.52", [port("p53", 53, "UDP", nodePort=30052)],
                type="NodePort"),
        service("ns", "remote-only", "172.30.0.53", [port("p80", 80, nodePort=30053)],
                type="NodePort", externalTrafficPolicy="Local", healthCheckNodePort=30002),
        endpoint_slice("ns", "local", "l-1", [here, there], [port("p80", 8080)]),
        endpoint_slice("ns", "cluster", "c-1", [here, there], [port("p80", 8080)]),
        endpoint_slice("ns", "dns", "d-1", [here], [port("p53", 5353, "UDP")]),
        endpoint_slice("ns", "remote-only", "r-1", [there], [port("p80", 8080)]),
    ]  # fmt: skip
    st = state_of(*objs)
    got = {}
    for name in ("local", "cluster", "dns", "remote-only"):
        got.update(service_listeners(st, NamespacedName("ns", name), IPFamily.IPV4))
    assert set(got) == {"IPv4/tcp/30050", "IPv4/tcp/30051"}
    local, cluster = got["IPv4/tcp/30050"], got["IPv4/tcp/30051"]
    assert (local.host, local.port) == ("127.0.0.1", 30050)
    assert local.endpoints == (("10.180.0.1", 8080),)
    assert set(cluster.endpoints) == {("10.180.0.1", 8080), ("10.180.0.2", 8080)}
    assert cluster.affinity_seconds == 10800 and local.affinity_seconds == 0
