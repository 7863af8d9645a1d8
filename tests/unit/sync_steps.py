"""One run of changes for the unit tests that drive a mode's syncs through a checking fake of
its kernel port: a start with every kind of service, then steps that each change one thing."""

from __future__ import annotations

from typing import Any

from pyproxy.model.events import Event, EventType
from pyproxy.sync.tracker import ChangeTracker
from tests.helpers import endpoint, endpoint_slice, node, port, service

NODE = node("node-a", addresses=["172.31.0.10"])
HTTP = port("http", 80)


def svc(name: str, ip: str, ports: list[dict[str, Any]] | None = None, **spec: Any) -> Any:
    return service("ns", name, ip, ports or [HTTP], **spec)


def eps(name: str, ips: list[str], node_name: str = "node-a", p: int = 8080,
        proto: str = "TCP") -> dict[str, Any]:  # fmt: skip
    return endpoint_slice("ns", name, f"{name}-1", [endpoint(ip, node_name) for ip in ips],
                          [port("http", p, proto)])  # fmt: skip


START = [
    NODE,
    svc("a", "10.96.0.1"),
    eps("a", ["10.1.0.1", "10.1.0.2"]),
    svc("b", "10.96.0.2", [port("http", 80, nodePort=30080)], type="NodePort",
        externalTrafficPolicy="Local"),
    eps("b", ["10.1.0.3"]),
    svc("c", "10.96.0.3", [port("http", 80, nodePort=30081)], type="LoadBalancer",
        loadBalancerSourceRanges=["192.0.2.0/24"],
        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.1"}]}}),
    eps("c", ["10.1.0.4"]),
    svc("d", "10.96.0.4", sessionAffinity="ClientIP"),
    eps("d", ["10.1.0.5", "10.1.0.6"]),
    svc("e", "10.96.0.5"),
    svc("f", "10.96.0.6", [port("dns", 53, "UDP")]),
    eps("f", ["10.1.0.7"], p=5353, proto="UDP"),
]  # fmt: skip

STEPS: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = [
    ("an endpoint changes", [eps("a", ["10.1.0.1", "10.1.0.9"])], []),
    ("a Local service loses its only endpoint", [eps("b", [])], []),
    ("the endpoint comes back on another node", [eps("b", ["10.1.0.3"], "node-b")], []),
    ("source ranges and affinity go",
     [svc("c", "10.96.0.3", [port("http", 80, nodePort=30081)], type="LoadBalancer",
          status={"loadBalancer": {"ingress": [{"ip": "203.0.113.1"}]}}),
      svc("d", "10.96.0.4")], []),
    ("a service is deleted", [], [svc("a", "10.96.0.1"), eps("a", [])]),
    ("a service with an external IP arrives",
     [svc("g", "10.96.0.7", externalIPs=["198.51.100.7"]), eps("g", ["10.1.0.8"])], []),
    ("a service without endpoints gets one", [eps("e", ["10.1.0.10"])], []),
    ("affinity comes back with another timeout",
     [svc("d", "10.96.0.4", sessionAffinity="ClientIP",
          sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}})], []),
    ("a port number changes", [svc("f", "10.96.0.6", [port("dns", 5353, "UDP")])], []),
    ("a NodePort service becomes ClusterIP", [svc("b", "10.96.0.2")], []),
    ("a service claims another's cluster IP and port as its external IP",
     [svc("h", "10.96.0.9", externalIPs=["10.96.0.4"]), eps("h", ["10.1.0.99"])], []),
    ("the claim goes", [], [svc("h", "10.96.0.9"), eps("h", [])]),
]  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def key(o: dict[str, Any]) -> tuple[str, str]:
    return o["kind"], o["metadata"]["name"]


def apply(
    tracker: ChangeTracker,
    objs: dict[tuple[str, str], dict[str, Any]],
    changed: list[dict[str, Any]],
    deleted: list[dict[str, Any]],
) -> None:
    """One step: the tracker sees it, and ``objs`` (what a full sync would be given) follows."""
    for o in changed:
        objs[key(o)] = o
        tracker.apply(Event(o["kind"], EventType.MODIFIED, o))
    for o in deleted:
        objs.pop(key(o))
        tracker.apply(Event(o["kind"], EventType.DELETED, o))
