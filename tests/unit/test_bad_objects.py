"""Malformed Services and EndpointSlices, generated with hypothesis (good objects with any of
their fields replaced by junk, or removed): the tracker never raises, and the good services
beside them keep exactly the state they have without the junk."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyproxy.model.events import Event, EventType
from pyproxy.sync.tracker import ChangeTracker
from tests.bad_objects import bad_object, generate
from tests.helpers import endpoint, endpoint_slice, node, port, service, tracker_with

NODE = "node-a"
WORDS = ["10.96.0.1", "fd00::1", "10.0.0.1/8", "TCP", "UDP", "SCTP", "NodePort", "LoadBalancer",
         "ExternalName", "Local", "Cluster", "ClientIP", "IPv4", "IPv6", "FQDN", "None", "",
         "-1", "65536", "0", "node-a", "kubernetes.io/service-name", "http"]  # fmt: skip
KEYS = ["metadata", "spec", "name", "namespace", "labels", "ports", "port", "nodePort",
        "protocol", "clusterIP", "clusterIPs", "type", "endpoints", "addresses", "conditions",
        "ready", "addressType", "externalIPs", "status", "loadBalancer", "ingress", "ip",
        "sessionAffinityConfig", "clientIP", "timeoutSeconds", "hints", "forZones"]  # fmt: skip
SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True)
    | st.text(max_size=12) | st.sampled_from(WORDS)
)  # fmt: skip
JUNK = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def good(i: int, ns: str = "good") -> list[dict[str, Any]]:
    return [
        service(ns, f"s{i}", f"10.96.{i // 250}.{i % 250 + 1}",
                [port("http", 80, nodePort=30000 + i), port("dns", 53, "UDP")],
                type="NodePort", sessionAffinity="ClientIP"),
        endpoint_slice(ns, f"s{i}", f"s{i}-1",
                       [endpoint(f"10.1.{i // 250}.{i % 250 + 1}", node=NODE, ready=True)],
                       [port("http", 8080), port("dns", 5353, "UDP")]),
    ]  # fmt: skip


@st.composite
def mangled(draw: st.DrawFn, i: int) -> dict[str, Any]:
    """One good object (in namespace ``junk``) with 1-3 of its fields replaced or removed."""
    obj = copy.deepcopy(draw(st.sampled_from(good(i, "junk"))))
    for _ in range(draw(st.integers(1, 3))):
        target: Any = obj
        while True:
            if isinstance(target, dict) and target:
                key = draw(st.sampled_from(sorted(target, key=str)))
            elif isinstance(target, list) and target:
                key = draw(st.integers(0, len(target) - 1))
            else:
                break
            if draw(st.booleans()) or not isinstance(target[key], dict | list):
                if isinstance(target, dict) and key != "kind" and draw(st.booleans()):
                    del target[key]
                else:
                    target[key] = draw(JUNK)
                break
            target = target[key]
    return obj


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 50).flatmap(mangled), min_size=1, max_size=30))
def test_junk_never_raises_and_good_services_keep_their_state(junk: list[dict]) -> None:
    goods = [o for i in range(5) for o in good(i)]
    expected = tracker_with(NODE, node(NODE), *goods).current_state()
    t = tracker_with(NODE, node(NODE), *goods)
    for obj in junk:
        for kind in ("Service", "EndpointSlice"):  # also as the kind it does not claim to be
            t.apply(Event(kind, EventType.ADDED, {**obj, "kind": kind}))
    got = t.current_state()
    for name, sp in expected.services.items():
        assert got.services.get(name) == sp
        assert got.endpoints.get(name) == expected.endpoints.get(name)
    # Deleting the junk again is as safe as adding it.
    for obj in junk:
        t.apply(Event(str(obj.get("kind", "Service")), EventType.DELETED, obj))
    t.current_state()


def test_every_bad_object_is_counted() -> None:
    t = ChangeTracker(NODE)
    bad_service = service("n", "x", "10.96.0.9", [port("p", 80)])
    bad_service["spec"]["ports"] = True
    t.apply(Event("Service", EventType.ADDED, bad_service))
    bad_slice = endpoint_slice("n", "x", "x-1", [], [port("p", 80)])
    bad_slice["endpoints"] = True
    t.apply(Event("EndpointSlice", EventType.ADDED, bad_slice))
    assert t.skipped["Service"] == 1 and t.skipped["EndpointSlice"] == 1


@settings(max_examples=400, deadline=None)
@given(bad_object())
def test_every_object_bad_by_construction_is_skipped_once(obj: dict) -> None:
    goods = [o for i in range(3) for o in good(i)]
    expected = tracker_with(NODE, node(NODE), *goods).current_state()
    t = tracker_with(NODE, node(NODE), *goods)
    t.apply(Event(obj["kind"], EventType.ADDED, obj))
    assert t.skipped == {obj["kind"]: 1}, obj
    got = t.current_state()
    assert got.services == expected.services and got.endpoints == expected.endpoints


def test_generate_names_each_object() -> None:
    objs = generate(50)
    assert len({(o["kind"], o["metadata"]["name"]) for o in objs}) == 50
