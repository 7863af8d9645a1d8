"""The benchmark writes services past its first 10,000 straight into etcd; the proxies must
read from the API server the same objects a create through the API makes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bench import objects
from tests.cluster.cluster import Cluster

pytestmark = pytest.mark.e2e

VOLATILE = ("uid", "creationTimestamp", "resourceVersion", "managedFields")


@pytest.fixture(scope="module")
def json_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(Path(tmp_path_factory.mktemp("bench-objects")), storage_json=True).start()
    try:
        yield c
    finally:
        c.stop()


def comparable(obj: dict[str, Any], i: int) -> dict[str, Any]:
    """``obj`` without what differs between any two creates (and service ``i``'s own name,
    address and trigger time)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in VOLATILE}
    meta["name"] = meta["name"].replace(f"svc-{i}", "svc-N")
    meta.get("labels", {}).update(
        {k: "svc-N" for k, v in meta.get("labels", {}).items() if v == f"svc-{i}"}
    )
    meta.get("annotations", {}).pop(objects.TRIGGER, None)
    out = {**obj, "metadata": meta}
    if obj["kind"] == "Service":
        out["spec"] = {**obj["spec"], "clusterIP": "ip", "clusterIPs": ["ip"]}
    if obj["kind"] == "EndpointSlice":
        out["endpoints"] = [{**e, "addresses": ["a"]} for e in obj["endpoints"]]
    return out


def test_stored_objects_read_back_as_created_ones(json_cluster: Cluster) -> None:
    c = json_cluster
    objects.grow(c, 0, 1, 3, lambda _: None)  # through the API
    objects.store(c, range(1, 3), 3, lambda _: None)  # into etcd
    services = {s["metadata"]["name"]: s for s in c.ok("GET", objects.SERVICES)["items"]}
    assert sorted(services) == ["svc-0", "svc-1", "svc-2"]
    for kind, path, name in (
        ("Service", objects.SERVICES, "svc-{}"),
        ("EndpointSlice", objects.SLICES, "svc-{}-1"),
    ):
        made = c.ok("GET", f"{path}/{name.format(0)}") | {"kind": kind}
        for i in (1, 2):
            written = c.ok("GET", f"{path}/{name.format(i)}") | {"kind": kind}
            assert comparable(written, i) == comparable(made, 0)
    ips = {s["spec"]["clusterIP"] for s in services.values()}
    assert len(ips) == 3  # no stored service took an address the API had allocated
    held = {a["metadata"]["name"]: a["spec"]["parentRef"]["name"]
            for a in c.ok("GET", objects.IPADDRESSES)["items"]}  # fmt: skip
    assert {held[s["spec"]["clusterIP"]] for s in services.values()} == set(services)
