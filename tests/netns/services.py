"""Service and EndpointSlice manifests for the namespace tests, and waiting for a service to
answer."""

from __future__ import annotations

import ipaddress
from typing import Any

from pyproxy.backends.iptables import names
from pyproxy.model.types import Endpoint, NamespacedName, Protocol, ServicePortName
from tests.netns.world import Pod, World, wait_for


def svc(name: str, ip: str, ports: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    status = spec.pop("status", {})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "t"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": ports, **spec},
        "status": status,
    }


HTTP = {"name": "http", "port": 80, "protocol": "TCP"}
HTTP_EP = [{"name": "http", "port": 8080, "protocol": "TCP"}]
DNS = {"name": "dns", "port": 53, "protocol": "UDP"}
DNS_EP = [{"name": "dns", "port": 5353, "protocol": "UDP"}]


def pods(world: World, *idx: int) -> list[Pod]:
    return [world.pods[i - 1] for i in idx]


def reachable(
    world: World,
    ip: str,
    port: int = 80,
    proto: str = "tcp",
    client: int = 0,
    ns: str | None = None,
    timeout: float = 15.0,
) -> Any:
    def ok() -> Any:
        r = world.probe(proto, ip, port, count=1, client=client, timeout=1.0, ns=ns)
        return r if r["replies"] else None

    return wait_for(ok, timeout=timeout, what=f"{proto} {ip}:{port} to answer")


def sep_chain(name: str, pod_ip: str) -> str:
    spn = ServicePortName(NamespacedName("t", name), "http", Protocol.TCP)
    return names.endpoint_chain(spn, Endpoint(ipaddress.ip_address(pod_ip), 8080))
