"""The /debug documents built from a model and a transaction log (pure parts)."""

from __future__ import annotations

import json

from pyproxy.backends.base import TEXT_KEPT, TransactionLog
from pyproxy.serving.debug import rules_doc, state_doc
from tests.helpers import endpoint, endpoint_slice, node, port, service, tracker_with
from tests.helpers import load_config as load


def test_state_doc_is_json_with_addresses_as_strings() -> None:
    t = tracker_with("node-a", node("node-a"),
                     service("ns", "web", "10.96.0.7", [port("http", 80)]),
                     endpoint_slice("ns", "web", "web-1", [endpoint("10.1.0.2", node="node-a")],
                                    [port("http", 8080)]))  # fmt: skip
    t.skipped_recent.append(("Service", "ns/bad", "spec.ports: not a list"))
    doc = json.loads(json.dumps(state_doc(t.current_state(), {"mode": "iptables"},
                                          list(t.skipped_recent))))  # fmt: skip
    (p,) = doc["services"]["ns/web"]
    assert p["name"] == "ns/web:http" and p["cluster_ips"] == ["10.96.0.7"]
    assert [(e["ip"], e["port"], e["node_name"]) for e in p["endpoints"]] == [
        ("10.1.0.2", 8080, "node-a")
    ]
    assert doc["skipped"] == [
        {"kind": "Service", "object": "ns/bad", "reason": "spec.ports: not a list"}
    ]


def test_rules_doc_keeps_one_per_tool_and_family_and_the_last_failure() -> None:
    log = TransactionLog()
    log.record("IPv4 nft iptables-restore", "*nat\nCOMMIT\n")
    log.record("IPv6 nft iptables-restore", "x" * (TEXT_KEPT + 10))
    log.record("IPv4 nft iptables-restore", "*filter\nCOMMIT\n")
    log.record("IPv4 nft iptables-restore", "*nat\n-A X\nCOMMIT\n", "line 2 failed")
    doc = rules_doc(log)
    assert [(t["what"], t["text"][:7]) for t in doc["lastApplied"]] == [
        ("IPv6 nft iptables-restore", "xxxxxxx"),
        ("IPv4 nft iptables-restore", "*filter"),
    ]
    big = doc["lastApplied"][0]
    assert big["truncated"] is True and big["bytes"] == TEXT_KEPT + 10
    assert len(big["text"]) == TEXT_KEPT
    assert doc["lastFailed"]["error"] == "line 2 failed"


def test_debug_paths_only_on_a_loopback_metrics_address() -> None:
    from pyproxy.cli.daemon import Daemon

    for address, served in (("127.0.0.1:10249", True), ("[::1]:10249", True),
                            ("0.0.0.0:10249", False), ("192.0.2.7:10249", False)):  # fmt: skip
        d = Daemon(load({"hostname_override": "n", "metrics_bind_address": address}))
        route = d.debug_routes()
        assert (route is not None) is served, address
        if route is not None:
            code, _, body = route("/debug/rules", {}) or (0, "", b"")
            assert code == 200 and json.loads(body) == {"lastApplied": [], "lastFailed": None}


def test_applying_records_success_and_failure_and_lets_the_error_through() -> None:
    import pytest

    log = TransactionLog()
    with log.applying("IPv4 nft iptables-restore", "*nat\nCOMMIT\n"):
        pass
    with log.applying("IPVS netlink", ""):  # nothing to apply: no transaction
        pass
    with pytest.raises(RuntimeError), log.applying("IPVS netlink", "-A -t 10.96.0.1:80\n"):
        raise RuntimeError("add virtual server: File exists")
    assert [t.what for t in log.applied] == ["IPv4 nft iptables-restore"]
    assert log.failed is not None and log.failed.error == "add virtual server: File exists"
