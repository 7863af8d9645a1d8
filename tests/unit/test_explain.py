"""pyproxy explain: each endpoint's reason, from the shared selection."""

from __future__ import annotations

from pyproxy.model.types import NamespacedName
from pyproxy.tools.explain import explain
from tests.helpers import endpoint, endpoint_slice, port, service, tracker_with


def line_for(text: str, ip: str) -> str:
    return next(ln for ln in text.splitlines() if ln.strip().startswith(ip))


def test_reasons_per_endpoint() -> None:
    objs = [
        service("ns", "web", "10.96.0.1", [port("http", 80)], internalTrafficPolicy="Local"),
        endpoint_slice(
            "ns",
            "web",
            "w",
            [
                endpoint("10.1.0.1", node="n1"),
                endpoint("10.1.0.2", node="n2"),
                endpoint("10.1.0.3", node="n1", ready=False, serving=False),
                endpoint("10.1.0.4", node="n1", ready=False, serving=True, terminating=True),
            ],
            [port("http", 8080)],
        ),
    ]
    text = explain(tracker_with("n1", *objs).current_state(), NamespacedName("ns", "web"))
    assert line_for(text, "10.1.0.1:8080").endswith(": used")
    assert "internalTrafficPolicy=Local" in line_for(text, "10.1.0.2:8080")
    assert line_for(text, "10.1.0.3:8080").endswith("not used: not ready")
    assert "terminating (ready endpoints exist)" in line_for(text, "10.1.0.4:8080")
    assert "internal traffic -> 1 endpoint(s)" in text


def test_terminating_fallback_and_no_endpoints() -> None:
    objs = [
        service("ns", "a", "10.96.0.2", [port("p", 80)]),
        endpoint_slice(
            "ns",
            "a",
            "a",
            [endpoint("10.1.0.9", ready=False, serving=True, terminating=True)],
            [port("p", 80)],
        ),
        service("ns", "b", "10.96.0.3", [port("p", 80)]),
    ]
    state = tracker_with("n1", *objs).current_state()
    assert "used: terminating but serving" in explain(state, NamespacedName("ns", "a"))
    assert "connections are refused" in explain(state, NamespacedName("ns", "b"))
    assert "no such service port" in explain(state, NamespacedName("ns", "zzz"))


def test_names_the_iptables_chains_and_nftables_objects() -> None:
    """Names checked against upstream's own test vectors: KUBE-SVC-XPGD46QRK7WJZT7O
    (iptables proxier_test.go) and ULMVA6XW (nftables proxier_test.go), for ns1/svc1:p80."""
    objs = [service("ns1", "svc1", "172.30.0.41", [port("p80", 80)])]
    text = explain(tracker_with("n1", *objs).current_state(), NamespacedName("ns1", "svc1"))
    words = text.replace(",", " ").split()
    assert "KUBE-SVC-XPGD46QRK7WJZT7O" in words
    assert "service-ULMVA6XW-ns1/svc1/tcp/p80" in words
    assert "local-ULMVA6XW-ns1/svc1/tcp/p80" in words
    assert "service-ips { 172.30.0.41 . tcp . 80 }" in text
