"""Builders for API-shaped objects (what the API server returns), shared by the tests."""

from __future__ import annotations

from typing import Any

from pyproxy.config.settings import ProxyConfig
from pyproxy.model.events import KINDS, Event, EventType
from pyproxy.sync.tracker import ChangeTracker


def service(
    ns: str, name: str, cluster_ip: str | None, ports: list[dict[str, Any]], **spec: Any
) -> dict[str, Any]:
    status = spec.pop("status", {})
    labels = spec.pop("labels", None)
    body: dict[str, Any] = {"ports": ports, **spec}
    if cluster_ip is not None:
        body["clusterIP"] = cluster_ip
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if labels:
        meta["labels"] = labels
    return {"kind": "Service", "metadata": meta, "spec": body, "status": status}


def port(name: str, number: int, protocol: str = "TCP", **extra: Any) -> dict[str, Any]:
    return {"name": name, "port": number, "protocol": protocol, **extra}


def endpoint(
    ip: str,
    node: str | None = None,
    ready: bool | None = None,
    serving: bool | None = None,
    terminating: bool | None = None,
    zones: list[str] | None = None,
) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [ip]}
    conds = {
        k: v
        for k, v in (("ready", ready), ("serving", serving), ("terminating", terminating))
        if v is not None
    }
    if conds:
        ep["conditions"] = conds
    if node:
        ep["nodeName"] = node
    if zones is not None:
        ep["hints"] = {"forZones": [{"name": z} for z in zones]}
    return ep


def endpoint_slice(
    ns: str,
    svc: str,
    name: str,
    endpoints: list[dict[str, Any]],
    ports: list[dict[str, Any]],
    address_type: str = "IPv4",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "labels": {"kubernetes.io/service-name": svc},
    }
    if annotations:
        meta["annotations"] = annotations
    return {
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports,
    }


def node(
    name: str,
    zone: str | None = None,
    addresses: list[str] | None = None,
    external: list[str] | None = None,
    pod_cidrs: list[str] | None = None,
) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": zone} if zone else {}
    addrs = [{"type": "InternalIP", "address": a} for a in addresses or []]
    addrs += [{"type": "ExternalIP", "address": a} for a in external or []]
    obj: dict[str, Any] = {"kind": "Node", "metadata": {"name": name, "labels": labels}}
    if addrs:
        obj["status"] = {"addresses": addrs}
    if pod_cidrs:
        obj["spec"] = {"podCIDRs": pod_cidrs}
    return obj


def tracker_with(node_name: str, *objs: dict[str, Any]) -> ChangeTracker:
    t = ChangeTracker(node_name)
    for kind in KINDS:
        t.apply(Event(kind, EventType.REPLACE, objects=[o for o in objs if o["kind"] == kind]))
        t.apply(Event(kind, EventType.SYNCED))
    return t


def parse_restore(text: str) -> dict[str, dict[str, Any]]:
    """iptables-restore text -> per table: declared chains, each chain's rules in order,
    deleted chains. Order matters only within a chain, as in upstream's own comparison."""
    tables: dict[str, dict[str, Any]] = {}
    cur: dict[str, Any] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line == "COMMIT":
            continue
        if line.startswith("*"):
            cur = tables.setdefault(line[1:], {"chains": set(), "rules": {}, "deleted": set()})
        elif line.startswith(":"):
            cur["chains"].add(line[1:].split()[0])
        elif line.startswith("-A "):
            chain = line.split()[1]
            cur["rules"].setdefault(chain, []).append(line)
        elif line.startswith("-X "):
            cur["deleted"].add(line.split()[1])
        else:
            raise AssertionError(f"unexpected line {line!r}")
    return tables


def load_config(flags: dict[str, Any], config_file: str | None = None) -> ProxyConfig:
    """The daemon's configuration from flags (and a file), with pyproxy's registered modes."""
    from pyproxy.backends import registry
    from pyproxy.config.load import load

    return load(flags, config_file, registry.modes(), registry.DEFAULT)


def cluster_ip(i: int) -> str:
    """Service ``i``'s ClusterIP in the tests' and benchmarks' layouts: 65,536 per /16 from
    10.96.0.0, none colliding."""
    return f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}"


def objects(n: int) -> list[dict[str, Any]]:
    """``n`` ClusterIP services in namespace bench, each with two endpoints."""
    out = []
    for i in range(n):
        out.append(service("bench", f"svc-{i}", cluster_ip(i), [port("http", 80)]))
        out.append(slice_of(i, [f"10.{128 + i // 256 % 64}.{i % 256}.{k}" for k in (1, 2)]))
    return out


def slice_of(i: int, ips: list[str]) -> dict[str, Any]:
    return endpoint_slice(
        "bench", f"svc-{i}", f"svc-{i}-1", [endpoint(ip) for ip in ips], [port("http", 8080)]
    )


def no_conntrack(filters: object, ipv6: bool) -> int:
    """The conntrack port: these services are TCP, so a sync must never call it."""
    raise AssertionError("conntrack was asked to clear TCP services' flows")
