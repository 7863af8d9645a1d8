"""The benchmark's cluster state, written through the API server: N selectorless ClusterIP
Services in namespace ``bench`` with one EndpointSlice each (M ready endpoints on node-a),
so both proxies see exactly the same objects and no controller rewrites them. Past
``API_CREATES`` services they are written to the API server's store instead (why: there)."""

from __future__ import annotations

import base64
import ipaddress
import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from tests.cluster.cluster import SERVICE_CIDR, Cluster

NS = "bench"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
SERVICES = f"/api/v1/namespaces/{NS}/services"
IPADDRESSES = "/apis/networking.k8s.io/v1/ipaddresses"
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


API_CREATES = 10_000
"""Services beyond this many are written to the API server's store (etcd) directly. Through
the API each create costs time in proportion to the services there already are (upstream's
ClusterIP allocator lists every IPAddress twice per allocation to set two gauges:
``ipallocator.go``'s ``createIPAddress``; 61% of the API server's CPU at 10,000 services, and
24 s per 1,000 creates there on this machine), so 50,000 would take most of an hour. Written
directly they are the same objects (``tests/e2e/test_bench_objects.py`` compares them), read
by the proxies through the same API server."""

IPADDRESS_LABELS = {
    "ipaddress.kubernetes.io/ip-family": "IPv4",
    "ipaddress.kubernetes.io/managed-by": "ipallocator.k8s.io",
}


def grow(cluster: Cluster, have: int, want: int, m: int, progress: Callable[[str], None]) -> None:
    """Create services and slices ``have`` .. ``want`` - 1: through the API up to
    ``API_CREATES``, into the store beyond it (which needs ``cluster.storage_json``)."""
    if have == 0:
        cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    t0 = time.monotonic()
    through_api = range(have, max(have, min(want, API_CREATES)))

    def create(i: int) -> None:
        cluster.ok("POST", SERVICES, service(i))
        cluster.ok("POST", SLICES, endpoint_slice(i, m))
        if (i + 1) % 1000 == 0:
            progress(f"  {i + 1 - have} of {want - have} services created")

    parallel(create, through_api)
    if want > through_api.stop:
        store(cluster, range(through_api.stop, want), m, progress)
    progress(f"  created {want - have} services with {m} endpoints each in "
             f"{time.monotonic() - t0:.0f}s")  # fmt: skip


def stored(kind: str, api_version: str, obj: dict[str, Any], now: str) -> dict[str, Any]:
    """``obj`` as the API server would store it: kind, version, a uid and a creation time."""
    meta = {**obj["metadata"], "uid": str(uuid.uuid4()), "creationTimestamp": now}
    return {**obj, "kind": kind, "apiVersion": api_version, "metadata": meta}


def stored_service(i: int, ip: str, now: str) -> dict[str, Any]:
    """Service ``i`` with the defaults the API server fills in on create."""
    obj = service(i)
    ports = [{**p, "targetPort": p["port"]} for p in obj["spec"]["ports"]]
    spec = {
        "ports": ports,
        "clusterIP": ip,
        "clusterIPs": [ip],
        "type": "ClusterIP",
        "sessionAffinity": "None",
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "internalTrafficPolicy": "Cluster",
    }
    svc = {**obj, "spec": spec, "status": {"loadBalancer": {}}}
    return stored("Service", "v1", svc, now)


def stored_slice(i: int, m: int, now: str) -> dict[str, Any]:
    obj = stored("EndpointSlice", "discovery.k8s.io/v1", endpoint_slice(i, m), now)
    obj["metadata"]["generation"] = 1
    return obj


def stored_ipaddress(i: int, ip: str, now: str) -> dict[str, Any]:
    """The IPAddress that allocates ``ip`` to service ``i``, so the API server's repair loop
    finds nothing to repair."""
    obj = {
        "metadata": {"name": ip, "labels": IPADDRESS_LABELS},
        "spec": {"parentRef": {"resource": "services", "namespace": NS, "name": f"svc-{i}"}},
    }
    return stored("IPAddress", "networking.k8s.io/v1", obj, now)


def free_cluster_ips(cluster: Cluster, count: int) -> list[str]:
    """``count`` addresses of the service range no IPAddress holds yet, lowest first."""
    taken = {a["metadata"]["name"] for a in cluster.ok("GET", IPADDRESSES)["items"]}
    hosts = (str(a) for a in ipaddress.ip_network(SERVICE_CIDR).hosts())
    free = [a for a in itertools.islice(hosts, 1, None) if a not in taken]
    if len(free) < count:
        raise RuntimeError(f"{SERVICE_CIDR} has {len(free)} free addresses, {count} needed")
    return free[:count]


def store(cluster: Cluster, items: range, m: int, progress: Callable[[str], None]) -> None:
    """Write services ``items`` (each with its IPAddress and EndpointSlice) into etcd, in
    transactions of at most etcd's default 128 operations."""
    if not cluster.storage_json:
        raise RuntimeError("writing objects to the store needs a cluster with storage_json")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ips = free_cluster_ips(cluster, len(items))
    per_txn = 128 // 3
    for start in range(0, len(items), per_txn):
        puts = []
        for i, ip in zip(items[start : start + per_txn], ips[start : start + per_txn], strict=True):
            puts += [
                (f"/registry/services/specs/{NS}/svc-{i}", stored_service(i, ip, now)),
                (f"/registry/ipaddresses/{ip}", stored_ipaddress(i, ip, now)),
                (f"/registry/endpointslices/{NS}/svc-{i}-1", stored_slice(i, m, now)),
            ]  # fmt: skip
        cluster.etcd("/v3/kv/txn", {"success": [
            {"requestPut": {"key": b64(key), "value": b64(json.dumps(obj))}} for key, obj in puts
        ]})  # fmt: skip
        done = start + per_txn
        if done // 5000 != start // 5000:
            progress(f"  services {items.start} to {items.start + min(done, len(items)) - 1}"
                     " written to the store")  # fmt: skip


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def change_endpoints(cluster: Cluster, services: Iterable[int], m: int, generation: int) -> float:
    """Replace each named service's endpoints (a new generation of addresses); returns the
    wall-clock time just before the first write."""
    t0 = time.time()

    def put(i: int) -> None:
        cluster.ok("PUT", f"{SLICES}/svc-{i}-1", endpoint_slice(i, m, generation))

    parallel(put, list(services))
    return t0
