"""pyproxy explain: each endpoint's reason, from the shared selection."""

from __future__ import annotations

from pyproxy.backends.iptables.backend import IptablesBackend
from pyproxy.backends.nftables.backend import NftablesBackend
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.types import NamespacedName
from pyproxy.tools.explain import Walk, explain, explain_data
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


def test_paths_name_each_modes_own_objects() -> None:
    """explain's paths come from the mode's walk and name that mode's objects. Names checked
    against upstream's own test vectors: KUBE-SVC-XPGD46QRK7WJZT7O (iptables proxier_test.go)
    and ULMVA6XW (nftables proxier_test.go), for ns1/svc1:p80."""
    objs = [
        service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
        endpoint_slice("ns1", "svc1", "s", [endpoint("10.180.0.1", node="n1")], [port("p80", 80)]),
    ]
    state = tracker_with("n1", *objs).current_state()
    svc = NamespacedName("ns1", "svc1")
    for backend in (IptablesBackend(ProxyConfig()), NftablesBackend(ProxyConfig())):
        walk = Walk(backend.mode, lambda p, b=backend: b.trace(state, p))  # type: ignore[misc]
        (doc,) = explain_data(state, svc, None, walk)
        (path,) = doc["paths"]
        assert path["to"] == "cluster IP 172.30.0.41:80"
        assert path["endpoints"] == {"10.180.0.1:80": 1.0}
        if backend.mode == "iptables":  # KUBE-SEP-SXIVWICOYRO3J4NJ: also upstream's vector
            assert path["objects"] == [
                "nat chain KUBE-SERVICES", "nat chain KUBE-SVC-XPGD46QRK7WJZT7O",
                "nat chain KUBE-SEP-SXIVWICOYRO3J4NJ", "nat chain KUBE-POSTROUTING",
            ]  # fmt: skip
        else:
            assert "chain service-ULMVA6XW-ns1/svc1/tcp/p80" in path["objects"]
            assert "map service-ips element 172.30.0.41 . tcp . 80" in path["objects"]
        text = explain(state, svc, None, walk)
        assert f"  paths ({backend.mode} mode; pyproxy trace shows each rule):" in text
