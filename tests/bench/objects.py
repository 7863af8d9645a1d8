"""The benchmark's cluster state, written through the API server: N selectorless ClusterIP
Services in namespace ``bench`` with one EndpointSlice each (M ready endpoints on node-a),
so both proxies see exactly the same objects and no controller rewrites them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from tests.cluster.cluster import Cluster

NS = "bench"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
SERVICES = f"/api/v1/namespaces/{NS}/services"
TRIGGER = "endpoints.kubernetes.io/last-change-trigger-time"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def endpoint_ip(i: int, j: int, m: int, generation: int = 0) -> str:
    k = i * m + j + generation * 1_000_000
    return f"10.{128 + k // 65536 % 128}.{k // 256 % 256}.{k % 256}"


def service(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"svc-{i}", "namespace": NS},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    }


def endpoint_slice(i: int, m: int, generation: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"svc-{i}-1",
            "namespace": NS,
            "labels": {
                "kubernetes.io/service-name": f"svc-{i}",
                "endpointslice.kubernetes.io/managed-by": "pyproxy-bench",
            },
            "annotations": {TRIGGER: now_rfc3339()},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [endpoint_ip(i, j, m, generation)],
                "conditions": {"ready": True},
                "nodeName": "node-a",
            }
            for j in range(m)
        ],
    }


def parallel(fn: Callable[[int], None], items: Iterable[int], workers: int = 16) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def grow(cluster: Cluster, have: int, want: int, m: int, progress: Callable[[str], None]) -> None:
    """Create services and slices ``have`` .. ``want`` - 1."""
    if have == 0:
        cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    t0 = time.monotonic()

    def create(i: int) -> None:
        cluster.ok("POST", SERVICES, service(i))
        cluster.ok("POST", SLICES, endpoint_slice(i, m))
        if (i + 1) % 1000 == 0:
            progress(f"  {i + 1 - have} of {want - have} services created")

    parallel(create, range(have, want))
    progress(f"  created {want - have} services with {m} endpoints each in "
             f"{time.monotonic() - t0:.0f}s")  # fmt: skip


def change_endpoints(cluster: Cluster, services: Iterable[int], m: int, generation: int) -> float:
    """Replace each named service's endpoints (a new generation of addresses); returns the
    wall-clock time just before the first write."""
    t0 = time.time()

    def put(i: int) -> None:
        cluster.ok("PUT", f"{SLICES}/svc-{i}-1", endpoint_slice(i, m, generation))

    parallel(put, list(services))
    return t0
