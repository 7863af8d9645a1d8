"""Counter parsing for pyproxy status (text in iptables-save -c's own format)."""

from __future__ import annotations

from pyproxy.backends.iptables.status import report
from pyproxy.backends.xtables.counters import parse

NAT = """*nat
:KUBE-SEP-AAAA - [0:0]
[7:420] -A KUBE-SEP-AAAA -s 10.1.0.1/32 -m comment --comment "ns/web:http" -j KUBE-MARK-MASQ
[12:720] -A KUBE-SEP-AAAA -p tcp -m comment --comment "ns/web:http" -m tcp -j DNAT --to-destination 10.1.0.1:8080
[3:180] -A KUBE-SEP-BBBB -p tcp -m comment --comment ns/web:http -m tcp -j DNAT --to-destination 10.1.0.2:8080
[9:540] -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "ns/web:http cluster IP" -j KUBE-SVC-X
COMMIT
"""
FILTER = """*filter
[4:240] -A KUBE-SERVICES -d 10.96.0.2/32 -p tcp -m comment --comment "ns/empty:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
[2:120] -A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "ns/local:http has no local endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 30001 -j DROP
COMMIT
"""


def test_connections_per_endpoint_and_refusals() -> None:
    c = parse(NAT, FILTER)
    assert c["ns/web:http"].endpoints == {"10.1.0.1:8080": (12, 720), "10.1.0.2:8080": (3, 180)}
    assert c["ns/web:http"].connections == 15
    assert c["ns/empty:http"].refused == 4 and c["ns/local:http"].dropped == 2
    text = report(c)
    assert "ns/web:http" in text and "refused 4" in text and "dropped 2" in text


def test_summary_of_a_daemon_state() -> None:
    from pyproxy.tools.status import summary

    doc = {
        "mode": "nftables", "nodeName": "n1",
        "lastSync": {"finished": 0.5, "seconds": 0.0421, "full": False, "ok": False,
                     "error": "IPv4 nftables transaction failed: x"},
        "syncs": 7, "fullSyncs": 2, "failedSyncs": 1,
        "pending": {"serviceChanges": 1, "endpointChanges": 3},
        "services": {"a/b": [{"endpoints": [{}, {}]}, {"endpoints": [{}]}]},
        "skippedCounts": {"Service": 2},
        "skipped": [{"kind": "Service", "object": "a/x", "reason": "spec.ports: not a list"}],
    }  # fmt: skip
    assert summary(doc).splitlines() == [
        "mode: nftables   node: n1",
        "last sync: partial, 1970-01-01T00:00:00Z, 0.042s, FAILED: IPv4 nftables transaction "
        "failed: x",
        "syncs: 7 (2 full, 1 failed)",
        "pending: 1 service, 3 endpoint changes",
        "services: 1   service ports: 2   endpoints: 3",
        "skipped objects: 2 Service",
        "  Service a/x: spec.ports: not a list",
    ]
