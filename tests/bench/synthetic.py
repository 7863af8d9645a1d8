"""Synthetic proxy states for benchmarks: N ClusterIP services (the first 2,000 with a
NodePort) with E ready endpoints each, addresses laid out so none collide up to 65,536."""

from __future__ import annotations

import ipaddress

from pyproxy.model.types import (
    Endpoint,
    NamespacedName,
    NodeInfo,
    Protocol,
    ProxyState,
    ServicePort,
    ServicePortName,
)
from tests.helpers import cluster_ip


def service_port(i: int) -> ServicePort:
    spn = ServicePortName(NamespacedName("bench", f"svc-{i}"), "http", Protocol.TCP)
    return ServicePort(
        spn,
        (ipaddress.ip_address(cluster_ip(i)),),
        80,
        node_port=30000 + i % 2000 if i < 2000 else 0,
    )


def endpoints(i: int, e: int, port: int = 8080) -> tuple[Endpoint, ...]:
    return tuple(
        Endpoint(
            ipaddress.ip_address(
                f"10.{128 + (i * e + j) // 65536}.{(i * e + j) // 256 % 256}.{(i * e + j) % 256}"
            ),
            port,
        )
        for j in range(e)
    )


def state(n: int, e: int) -> ProxyState:
    services = {}
    eps = {}
    for i in range(n):
        sp = service_port(i)
        services[sp.name] = sp
        eps[sp.name] = endpoints(i, e)
    return ProxyState(services, eps, NodeInfo("node-a"))
