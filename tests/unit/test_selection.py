"""Endpoint selection: traffic policies, terminating fallback, topology hints."""

from __future__ import annotations

import ipaddress

from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    NamespacedName,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortName,
)

NODE = NodeInfo("n1", {"topology.kubernetes.io/zone": "za"})
SPN = ServicePortName(NamespacedName("ns", "s"), "p", Protocol.TCP)


def sp(**kw: object) -> ServicePort:
    return ServicePort(SPN, (ipaddress.ip_address("10.96.0.1"),), 80, **kw)  # type: ignore[arg-type]


def ep(last: int, node: str = "n2", **kw: object) -> Endpoint:
    return Endpoint(ipaddress.ip_address(f"10.1.0.{last}"), 80, node_name=node, **kw)  # type: ignore[arg-type]


def ips(eps: tuple[Endpoint, ...]) -> list[int]:
    return [int(str(e.ip).rsplit(".", 1)[1]) for e in eps]


def test_cluster_policy_uses_ready_endpoints() -> None:
    s = categorize_endpoints(sp(), [ep(1), ep(2, ready=False, serving=False)], NODE)
    assert ips(s.cluster) == [1] and s.local == () and s.has_any


def test_terminating_fallback_only_without_ready() -> None:
    term = ep(2, ready=False, serving=True, terminating=True)
    assert ips(categorize_endpoints(sp(), [ep(1), term], NODE).cluster) == [1]
    assert ips(categorize_endpoints(sp(), [term], NODE).cluster) == [2]
    dead = ep(3, ready=False, serving=False, terminating=True)
    assert not categorize_endpoints(sp(), [dead], NODE).has_any


def test_external_local_policy() -> None:
    svc = sp(node_port=30000, external_policy_local=True)
    s = categorize_endpoints(svc, [ep(1, "n1"), ep(2, "n2")], NODE)
    assert ips(s.cluster) == [1, 2] and ips(s.local) == [1]
    s2 = categorize_endpoints(svc, [ep(2, "n2")], NODE)
    assert s2.has_any and s2.local == ()


def test_internal_local_policy() -> None:
    s = categorize_endpoints(sp(internal_policy_local=True), [ep(1, "n1"), ep(2)], NODE)
    assert s.cluster == () and ips(s.local) == [1] and ips(s.all_reachable) == [1]


def test_zone_hints_used_only_when_all_have_them() -> None:
    a = ep(1, zone_hints=frozenset({"za"}))
    b = ep(2, zone_hints=frozenset({"zb"}))
    assert ips(categorize_endpoints(sp(), [a, b], NODE).cluster) == [1]
    assert ips(categorize_endpoints(sp(), [a, b, ep(3)], NODE).cluster) == [1, 2, 3]
    # no endpoint hinted for our zone: hints are ignored
    assert ips(categorize_endpoints(sp(), [b], NODE).cluster) == [2]
