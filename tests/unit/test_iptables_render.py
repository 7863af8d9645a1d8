"""Rendered rules compared with upstream kube-proxy's expected output for the same objects.

The expected texts are copied from upstream's pkg/proxy/iptables/proxier_test.go
(TestOverallIPTablesRules and TestSyncProxyRulesRepeated), whose fake proxier uses
clusterCIDR 10.0.0.0/8, localhost NodePorts on, and an iptables without --random-fully.
Two upstream-only details are removed from the expectation, each noted where it is: the
nfacct counters (upstream adds them only when the kernel has nfacct; pyproxy does not use it).
Like upstream's assertIPTablesRulesEqual, the comparison ignores the order of chains and
of chain blocks, but not the order of rules within a chain.
"""

from __future__ import annotations

import ipaddress

from pyproxy.backends.iptables.render import IptablesConfig
from pyproxy.backends.iptables.table import Renderer, partial_restore, render
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.types import NamespacedName
from tests.helpers import (
    endpoint,
    endpoint_slice,
    node,
    parse_restore,
    port,
    service,
    tracker_with,
)

NODE = "test-node"
CFG = IptablesConfig(
    proxy=ProxyConfig(cluster_cidrs=(ipaddress.ip_network("10.0.0.0/8"),)),
    random_fully=False,
)
# Upstream's fake proxier has node IP 192.168.0.2; here that is the Node object's InternalIP.
NODE_OBJ = node(NODE, addresses=["192.168.0.2"])

UPSTREAM_OVERALL = """
*filter
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-NODEPORTS -m comment --comment "ns2/svc2:p80 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT
-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP
COMMIT
*nat
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXT-4SW47YFZTEDKD3PK - [0:0]
:KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-EXT-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-EXT-X27LE4BHSL4DOUIK - [0:0]
:KUBE-FW-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-C6EBXVWJJZMIWKLZ - [0:0]
:KUBE-SEP-I77PXRDZVX7PMWMN - [0:0]
:KUBE-SEP-OYPFS5VJICHGATKP - [0:0]
:KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]
:KUBE-SVC-4SW47YFZTEDKD3PK - [0:0]
:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SVC-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-SVC-X27LE4BHSL4DOUIK - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 -j KUBE-EXT-X27LE4BHSL4DOUIK
-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 external IP" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j KUBE-EXT-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 loadbalancer IP" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j KUBE-FW-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-EXT-4SW47YFZTEDKD3PK -m comment --comment "masquerade traffic for ns4/svc4:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-4SW47YFZTEDKD3PK -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "masquerade traffic for ns5/svc5:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-NUKIZ6OKUXPJNT4C -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "masquerade traffic for ns3/svc3:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ
-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80
-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ
-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --rcheck --seconds 10800 --reap -j KUBE-SEP-I77PXRDZVX7PMWMN
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -j KUBE-SEP-I77PXRDZVX7PMWMN
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -j KUBE-SEP-OYPFS5VJICHGATKP
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
COMMIT
"""
# Upstream also has, only when nfacct is available, "-m nfacct --nfacct-name
# ct_state_invalid_dropped_pkts" on the INVALID rule and one extra localhost rule per NodePort
# ("-d 127.0.0.0/8 ... -m nfacct --nfacct-name localhost_nps_accepted_pkts"); removed above.


def overall_objects() -> list[dict]:
    p80 = [port("p80", 80)]
    return [
        NODE_OBJ,
        service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
        service(
            "ns2",
            "svc2",
            "172.30.0.42",
            [port("p80", 80, nodePort=3001)],
            type="LoadBalancer",
            externalTrafficPolicy="Local",
            externalIPs=["192.168.99.22"],
            healthCheckNodePort=30000,
            status={"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}},
        ),
        service("ns3", "svc3", "172.30.0.43", [port("p80", 80, nodePort=3003)], type="NodePort"),
        service(
            "ns4",
            "svc4",
            "172.30.0.44",
            [port("p80", 80, targetPort=80)],
            type="NodePort",
            externalIPs=["192.168.99.33"],
        ),
        service(
            "ns5",
            "svc5",
            "172.30.0.45",
            [port("p80", 80, nodePort=3002)],
            type="LoadBalancer",
            externalTrafficPolicy="Cluster",
            healthCheckNodePort=30000,
            loadBalancerSourceRanges=[" 203.0.113.0/25"],
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}},
            status={"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}},
        ),
        service("ns6", "svc6", "172.30.0.46", [port("p80", 80, targetPort=80)], type="ClusterIP"),
        endpoint_slice("ns1", "svc1", "svc1-1", [endpoint("10.180.0.1")], p80),
        endpoint_slice("ns2", "svc2", "svc2-1", [endpoint("10.180.0.2")], p80),
        endpoint_slice("ns3", "svc3", "svc3-1", [endpoint("10.180.0.3")], p80),
        endpoint_slice(
            "ns4",
            "svc4",
            "svc4-1",
            [endpoint("10.180.0.4"), endpoint("10.180.0.5", node=NODE)],
            p80,
        ),
        endpoint_slice("ns5", "svc5", "svc5-1", [endpoint("10.180.0.3")], p80),
    ]


def test_overall_rules_match_upstream() -> None:
    state = tracker_with(NODE, *overall_objects()).current_state()
    got = parse_restore(render(state, CFG).text())
    assert got == parse_restore(UPSTREAM_OVERALL)


def test_chain_names_are_upstreams_hashes() -> None:
    from pyproxy.backends.iptables import names
    from pyproxy.model.types import Endpoint, Protocol, ServicePortName

    spn = ServicePortName(NamespacedName("ns1", "svc1"), "p80", Protocol.TCP)
    assert names.cluster_chain(spn) == "KUBE-SVC-XPGD46QRK7WJZT7O"
    ep = Endpoint(ipaddress.ip_address("10.180.0.1"), 80)
    assert names.endpoint_chain(spn, ep) == "KUBE-SEP-SXIVWICOYRO3J4NJ"


# TestSyncProxyRulesRepeated, first sync: two ClusterIP services, one endpoint each.
UPSTREAM_REPEATED_NAT = """
*nat
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-SNQ3ZNILQDEJNDQO - [0:0]
:KUBE-SEP-UHEGFW77JX3KXTOV - [0:0]
:KUBE-SVC-2VJB64SDSIJUP5T6 - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p8080 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 8080 -j KUBE-SVC-2VJB64SDSIJUP5T6
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-SEP-SNQ3ZNILQDEJNDQO -m comment --comment ns1/svc1:p80 -s 10.0.1.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SNQ3ZNILQDEJNDQO -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.0.1.1:80
-A KUBE-SEP-UHEGFW77JX3KXTOV -m comment --comment ns2/svc2:p8080 -s 10.0.2.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-UHEGFW77JX3KXTOV -m comment --comment ns2/svc2:p8080 -m tcp -p tcp -j DNAT --to-destination 10.0.2.1:8080
-A KUBE-SVC-2VJB64SDSIJUP5T6 -m comment --comment "ns2/svc2:p8080 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 8080 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-2VJB64SDSIJUP5T6 -m comment --comment "ns2/svc2:p8080 -> 10.0.2.1:8080" -j KUBE-SEP-UHEGFW77JX3KXTOV
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.0.1.1:80" -j KUBE-SEP-SNQ3ZNILQDEJNDQO
COMMIT
"""


def repeated_objects(with_svc3: bool = False) -> list[dict]:
    objs = [
        NODE_OBJ,
        service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
        service("ns2", "svc2", "172.30.0.42", [port("p8080", 8080)]),
        endpoint_slice("ns1", "svc1", "svc1-1", [endpoint("10.0.1.1")], [port("p80", 80)]),
        endpoint_slice("ns2", "svc2", "svc2-1", [endpoint("10.0.2.1")], [port("p8080", 8080)]),
    ]
    if with_svc3:
        objs += [
            service("ns3", "svc3", "172.30.0.43", [port("p80", 80)]),
            endpoint_slice("ns3", "svc3", "svc3-1", [endpoint("10.0.3.1")], [port("p80", 80)]),
        ]
    return objs


def test_repeated_sync_first_state_matches_upstream() -> None:
    state = tracker_with(NODE, *repeated_objects()).current_state()
    got = parse_restore(render(state, CFG).text())["nat"]
    assert got == parse_restore(UPSTREAM_REPEATED_NAT)["nat"]


def partial(before: list[dict], after: list[dict], changed: set[NamespacedName]) -> str:
    renderer = Renderer(CFG)
    programmed = renderer.render(tracker_with(NODE, *before).current_state())
    updates = renderer.updates(tracker_with(NODE, *after).current_state(), changed, programmed)
    assert updates is not None
    return partial_restore(programmed, updates).text


def nat_lines(text: str) -> list[str]:
    return text.split("*nat\n", 1)[1].splitlines()


def test_partial_sync_writes_only_the_changed_service() -> None:
    text = partial(
        repeated_objects(), repeated_objects(with_svc3=True), {NamespacedName("ns3", "svc3")}
    )
    nat = nat_lines(text)
    # Upstream's expectation for this step names svc3's chains and no others; new chains
    # are created (-N), KUBE-SERVICES gets one line inserted, not redeclared (a flush).
    assert nat == [
        "-N KUBE-SVC-X27LE4BHSL4DOUIK",
        "-N KUBE-SEP-BSWRHOQ77KEXZLNL",
        '-I KUBE-SERVICES 1 -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp '
        "-d 172.30.0.43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK",
        '-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp '
        "-p tcp -d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
        '-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.0.3.1:80" '
        "-j KUBE-SEP-BSWRHOQ77KEXZLNL",
        "-A KUBE-SEP-BSWRHOQ77KEXZLNL -m comment --comment ns3/svc3:p80 -s 10.0.3.1 "
        "-j KUBE-MARK-MASQ",
        "-A KUBE-SEP-BSWRHOQ77KEXZLNL -m comment --comment ns3/svc3:p80 -m tcp -p tcp "
        "-j DNAT --to-destination 10.0.3.1:80",
        "COMMIT",
    ]
    assert text.startswith("*filter\nCOMMIT\n")  # nothing changed in the filter table


def test_partial_sync_flushes_the_chains_an_endpoint_change_rewrites() -> None:
    before = repeated_objects()
    after = [
        o
        if o["metadata"]["name"] != "svc1-1"
        else endpoint_slice("ns1", "svc1", "svc1-1", [endpoint("10.0.1.2")], [port("p80", 80)])
        for o in before
    ]
    nat = nat_lines(partial(before, after, {NamespacedName("ns1", "svc1")}))
    kept_svc = "KUBE-SVC-XPGD46QRK7WJZT7O"
    old_sep = "KUBE-SEP-SNQ3ZNILQDEJNDQO"
    new_sep = next(ln.split()[1] for ln in nat if ln.startswith("-N KUBE-SEP-"))
    assert new_sep != old_sep
    # The service chain exists: flushed and refilled. The new endpoint's chain is created,
    # the old one flushed and, once nothing jumps to it, deleted.
    assert nat[:3] == [f"-F {kept_svc}", f"-N {new_sep}", f"-F {old_sep}"]
    assert nat[-2:] == [f"-X {old_sep}", "COMMIT"]
    assert f"-N {kept_svc}" not in nat
    assert not [ln for ln in nat if ln.startswith(("-I ", "-D "))]  # KUBE-SERVICES untouched


def test_partial_sync_deletes_a_removed_services_chains() -> None:
    objs = [o for o in repeated_objects() if o["metadata"]["name"] not in ("svc2", "svc2-1")]
    nat = nat_lines(partial(repeated_objects(), objs, {NamespacedName("ns2", "svc2")}))
    # Upstream deletes exactly svc2's chains, flushed first, after the jump to them is gone.
    assert nat[:2] == ["-F KUBE-SVC-2VJB64SDSIJUP5T6", "-F KUBE-SEP-UHEGFW77JX3KXTOV"]
    assert nat[-3:] == ["-X KUBE-SVC-2VJB64SDSIJUP5T6", "-X KUBE-SEP-UHEGFW77JX3KXTOV", "COMMIT"]
    deletes = [i for i, ln in enumerate(nat) if ln.startswith("-D KUBE-SERVICES ")]
    assert len(deletes) == 1 and deletes[0] < nat.index("-X KUBE-SVC-2VJB64SDSIJUP5T6")
    assert nat[deletes[0]].endswith(" -j KUBE-SVC-2VJB64SDSIJUP5T6")
