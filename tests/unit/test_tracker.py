"""Change-tracker merge rules and the changed set handed to partial syncs."""

from __future__ import annotations

from pyproxy.model.events import Event, EventType
from pyproxy.model.types import NamespacedName
from pyproxy.sync.tracker import ChangeTracker
from tests.helpers import endpoint, endpoint_slice, node, port, service, tracker_with

WEB = NamespacedName("ns", "web")


def svc(ip: str = "10.96.0.1", **kw: object) -> dict:
    return service("ns", "web", ip, [port("http", 80)], **kw)


def sl(*ips: str, name: str = "web-1") -> dict:
    return endpoint_slice("ns", "web", name, [endpoint(i) for i in ips], [port("http", 8080)])


def ev(kind: str, typ: EventType, obj: dict) -> Event:
    return Event(kind, typ, obj)


def test_not_initialized_until_every_kind_is_listed() -> None:
    """Services and EndpointSlices, as upstream, and the Node and ServiceCIDRs too: a first
    sync without the Node would be followed at once by a second full one."""
    t = ChangeTracker("n1")
    for kind in ("Service", "EndpointSlice", "Node"):
        assert not t.initialized
        t.apply(Event(kind, EventType.SYNCED))
    assert not t.initialized
    t.apply(Event("ServiceCIDR", EventType.SYNCED))
    assert t.initialized


def test_add_then_delete_is_no_change() -> None:
    t = tracker_with("n1")
    t.take()
    t.apply(ev("Service", EventType.ADDED, svc()))
    assert t.pending_counts() == (1, 0)
    t.apply(ev("Service", EventType.DELETED, svc()))
    assert t.pending_counts() == (0, 0)
    assert t.take().changed_services == frozenset()


def test_irrelevant_update_is_no_change() -> None:
    t = tracker_with("n1", svc(), sl("10.1.0.1"))
    t.take()
    changed = svc()
    changed["metadata"]["annotations"] = {"irrelevant": "yes"}
    assert not t.apply(ev("Service", EventType.MODIFIED, changed))
    assert t.take().changed_services == frozenset()


def test_update_and_revert_is_no_change() -> None:
    t = tracker_with("n1", svc(), sl("10.1.0.1"))
    t.take()
    t.apply(ev("EndpointSlice", EventType.MODIFIED, sl("10.1.0.1", "10.1.0.2")))
    assert t.pending_counts() == (0, 1)
    t.apply(ev("EndpointSlice", EventType.MODIFIED, sl("10.1.0.1")))
    assert t.pending_counts() == (0, 0)


def test_changed_set_names_only_changed_services() -> None:
    other = service("ns", "other", "10.96.0.2", [port("p", 81)])
    t = tracker_with("n1", svc(), sl("10.1.0.1"), other)
    first = t.take()
    assert first.changed_services == {WEB, NamespacedName("ns", "other")}
    t.apply(ev("EndpointSlice", EventType.MODIFIED, sl("10.1.0.2")))
    ch = t.take()
    assert ch.changed_services == {WEB}
    assert ch.endpoint_changes == 1 and ch.service_changes == 0
    (changed_port,) = [spn for spn in ch.state.endpoints if spn.service == WEB]
    assert [str(e) for e in ch.state.endpoints[changed_port]] == ["10.1.0.2:8080"]


def test_slices_merge_and_dedupe() -> None:
    t = tracker_with(
        "n1", svc(), sl("10.1.0.2", "10.1.0.1", name="a"), sl("10.1.0.1", "10.1.0.3", name="b")
    )
    (eps,) = t.current_state().endpoints.values()
    assert [str(e) for e in eps] == ["10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"]


def test_bad_object_is_skipped_counted_and_keeps_old_rules() -> None:
    t = tracker_with("n1", svc(), sl("10.1.0.1"))
    t.take()
    bad = service("ns", "web", "10.96.0.1", [port("http", 99999)])
    assert not t.apply(ev("Service", EventType.MODIFIED, bad))
    assert t.skipped["Service"] == 1
    assert len(t.current_state().services) == 1  # the last good version stays
    t.apply(ev("Service", EventType.ADDED, service("ns", "new", "10.96.0.9", [port("p", 1)])))
    assert len(t.current_state().services) == 2  # other services are unaffected


def test_slice_for_unknown_service_is_logged_and_counted() -> None:
    t = tracker_with("n1", sl("10.1.0.1"))
    t.current_state()
    assert t.skipped["EndpointSlice"] == 1


def test_replace_deletes_missing_objects() -> None:
    t = tracker_with("n1", svc(), sl("10.1.0.1"))
    t.take()
    t.apply(Event("Service", EventType.REPLACE, objects=[]))
    ch = t.take()
    assert ch.changed_services == {WEB} and not ch.state.services


def test_node_label_change_requests_full_sync() -> None:
    t = tracker_with("n1", node("n1", zone="a"))
    assert t.take().full_reason == "node labels changed"
    t.apply(ev("Node", EventType.MODIFIED, node("n1", zone="b")))
    assert t.take().full_reason == "node labels changed"
    t.apply(ev("Node", EventType.MODIFIED, node("other", zone="c")))  # not us: ignored
    assert t.node.zone == "b"


def test_ignored_by_proxy_name_label() -> None:
    labelled = svc(labels={"service.kubernetes.io/service-proxy-name": "x"})
    t = tracker_with("n1", labelled)
    assert not t.current_state().services


def cidr(*ranges: str, name: str = "kubernetes") -> dict:
    return {"kind": "ServiceCIDR", "metadata": {"name": name}, "spec": {"cidrs": list(ranges)}}


def test_service_cidr_change_then_node_update_still_asks_for_a_full_sync() -> None:
    """A ServiceCIDR change sets up a full sync; a Node update that arrives before the sync
    (its addresses, say: labels unchanged) must not take that back."""
    t = tracker_with("n1", node("n1", zone="a"), cidr("10.96.0.0/16"))
    t.take()
    t.apply(ev("ServiceCIDR", EventType.MODIFIED, cidr("10.96.0.0/16", "10.97.0.0/16")))
    t.apply(ev("Node", EventType.MODIFIED, node("n1", zone="a", addresses=["192.0.2.1"])))
    ch = t.take()
    assert ch.full_reason == "service CIDRs changed"
    assert t.take().full_reason == ""


def test_node_labels_changed_and_back_before_a_sync_need_no_full_sync() -> None:
    t = tracker_with("n1", node("n1", zone="a"))
    t.take()
    t.apply(ev("Node", EventType.MODIFIED, node("n1", zone="b")))
    t.apply(ev("Node", EventType.MODIFIED, node("n1", zone="a")))
    assert t.take().full_reason == ""


def test_node_label_change_and_cidr_change_name_both_reasons() -> None:
    t = tracker_with("n1", node("n1", zone="a"), cidr("10.96.0.0/16"))
    t.take()
    t.apply(ev("Node", EventType.MODIFIED, node("n1", zone="b")))
    t.apply(ev("ServiceCIDR", EventType.DELETED, cidr("10.96.0.0/16")))
    assert t.take().full_reason == "node labels changed, service CIDRs changed"
