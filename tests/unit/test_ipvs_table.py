"""IPVS mode's per-service table: partial updates land where a full render lands, and their
deltas, written onto a simulated kernel, leave it equal to a fresh full sync's. Pure: the
kernel behaviour itself is tested in user-mode Linux (tests/ipvs_guest)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyproxy.backends.ipvs.diff import CurrentDest, CurrentService, Plan, plan_partial
from pyproxy.backends.ipvs.render import Entry, IpvsConfig, VSKey
from pyproxy.backends.ipvs.table import IpvsCache, render
from pyproxy.model.events import Event, EventType
from pyproxy.model.types import IPFamily
from tests.helpers import endpoint, endpoint_slice, node, port, service, tracker_with

CFG = IpvsConfig(family=IPFamily.IPV4)
NODE = node("node-a", addresses=["172.31.0.10"])
HTTP = port("http", 80)
DNS = port("dns", 53, "UDP")


def svc(name: str, ip: str, ports: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return service("ns", name, ip, ports, **spec)


def eps(name: str, ips: list[str], ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ep_ports = [{**p, "port": p["port"] + 8000} for p in (ports or [HTTP])]
    return endpoint_slice("ns", name, f"{name}-1", [endpoint(ip, "node-a") for ip in ips], ep_ports)


@dataclass
class Kernel:
    """What IPVS, kube-ipvs0 and the ipsets hold, as the backend would write them."""

    services: dict[VSKey, dict[tuple[str, int], int]] = field(default_factory=dict)
    addresses: set[str] = field(default_factory=set)
    ipsets: dict[str, set[Entry]] = field(default_factory=dict)

    def current(self) -> dict[VSKey, CurrentService]:
        return {
            k: CurrentService("rr", 0, {d: CurrentDest(w) for d, w in dests.items()})
            for k, dests in self.services.items()
        }

    def write(self, p: Plan) -> None:
        for key, _, _ in p.add_services:
            self.services[key] = {}
        for key, dest, weight, _ in p.set_dests:
            self.services[key][dest] = weight
        for key, dest in p.delete_dests:
            del self.services[key][dest]
        for key in p.delete_services:
            del self.services[key]
        self.addresses |= p.add_addresses
        self.addresses -= p.delete_addresses
        for name, entries in p.ipset_add.items():
            self.ipsets.setdefault(name, set()).update(entries)
        for name, entries in p.ipset_delete.items():
            self.ipsets[name] -= entries


STEPS: list[tuple[str, list[dict[str, Any]]]] = [
    ("add a service", [svc("a", "10.96.0.1", [HTTP]), eps("a", ["10.1.0.1", "10.1.0.2"])]),
    ("an endpoint goes", [eps("a", ["10.1.0.2"])]),
    ("a second port", [svc("a", "10.96.0.1", [HTTP, DNS]), eps("a", ["10.1.0.2"], [HTTP, DNS])]),
    (
        "a NodePort",
        [
            svc("b", "10.96.0.2", [{**HTTP, "nodePort": 30080}], type="NodePort"),
            eps("b", ["10.1.0.2", "10.1.0.3"]),
        ],
    ),
    # b and c share an external IP on different ports; b's endpoint 10.1.0.2:8080 is also
    # a's, so their KUBE-LOOP-BACK entry is shared too.
    (
        "shared external IP",
        [
            svc(
                "b",
                "10.96.0.2",
                [{**HTTP, "nodePort": 30080}],
                type="NodePort",
                externalIPs=["198.51.100.1"],
            ),
            svc("c", "10.96.0.3", [port("https", 443)], externalIPs=["198.51.100.1"]),
            eps("c", ["10.1.0.4"], [port("https", 443)]),
        ],
    ),
    ("affinity", [svc("a", "10.96.0.1", [HTTP, DNS], sessionAffinity="ClientIP")]),
    ("one sharer goes", [svc("c", "10.96.0.3", [port("https", 443)])]),
    (
        "a load balancer",
        [
            svc(
                "d",
                "10.96.0.4",
                [{**HTTP, "nodePort": 30081}],
                type="LoadBalancer",
                externalTrafficPolicy="Local",
                loadBalancerSourceRanges=["10.0.0.0/8"],
                status={"loadBalancer": {"ingress": [{"ip": "203.0.113.4"}]}},
            ),
            eps("d", ["10.1.0.5"]),
        ],
    ),
    ("endpoints move", [eps("b", ["10.1.0.6"]), eps("d", [])]),
]


def deleted(obj: dict[str, Any]) -> Event:
    return Event(obj["kind"], EventType.DELETED, obj)


def test_partial_updates_equal_a_full_render_and_their_deltas_a_full_sync() -> None:
    tracker = tracker_with("node-a", NODE)
    first = tracker.take()
    cache = IpvsCache(CFG)
    table = cache.render(first.state)
    kernel = Kernel()
    steps = [*STEPS, ("delete b", []), ("delete a's slice", [])]
    for what, objs in steps:
        if what == "delete b":
            tracker.apply(deleted(svc("b", "10.96.0.2", [HTTP])))
            tracker.apply(deleted(eps("b", [])))
        elif what == "delete a's slice":
            tracker.apply(deleted(eps("a", [])))
        for obj in objs:
            tracker.apply(Event(obj["kind"], EventType.MODIFIED, obj))
        changes = tracker.take()
        updates = cache.updates(changes.state, changes.changed_services, table)
        assert updates is not None, what
        before = table.desired()
        delta = table.delta(updates)
        assert table.desired() == before, f"{what}: working out the delta changed the table"
        table.apply(updates)
        want = render(changes.state, CFG)
        assert table.real_servers == sum(len(vs.dests) for vs in want.services.values()), what
        got = table.desired()
        assert (got.services, got.addresses, got.no_local) == (
            want.services, want.addresses, want.no_local,
        ), what  # fmt: skip
        assert {n: v for n, v in got.ipsets.items() if v} == {
            n: v for n, v in want.ipsets.items() if v
        }, what
        kernel.write(plan_partial(delta.wanted, kernel.current(), delta))
        assert kernel.services == {k: vs.dests for k, vs in want.services.items()}, what
        assert kernel.addresses == want.addresses, what
        assert {n: v for n, v in kernel.ipsets.items() if v} == {
            n: v for n, v in want.ipsets.items() if v
        }, what
    assert kernel.addresses == {"10.96.0.1", "10.96.0.3", "10.96.0.4", "203.0.113.4"}


def test_shared_items_leave_with_their_last_user() -> None:
    tracker = tracker_with(
        "node-a",
        NODE,
        svc("b", "10.96.0.2", [HTTP], externalIPs=["198.51.100.1"]),
        svc("c", "10.96.0.3", [port("https", 443)], externalIPs=["198.51.100.1"]),
        eps("b", ["10.1.0.2"]),
        eps("c", ["10.1.0.2"], [HTTP]),  # the same pod port: one KUBE-LOOP-BACK entry
    )
    cache = IpvsCache(CFG)
    table = cache.render(tracker.take().state)
    tracker.apply(deleted(svc("c", "10.96.0.3", [HTTP])))
    changes = tracker.take()
    updates = cache.updates(changes.state, changes.changed_services, table)
    assert updates is not None
    delta = table.delta(updates)
    assert delta.delete_addresses == {"10.96.0.3"}  # 198.51.100.1 is still b's
    assert delta.ipset_delete.get("KUBE-LOOP-BACK", set()) == set()
    assert delta.ipset_delete["KUBE-CLUSTER-IP"] == {("10.96.0.3", "tcp:443")}
    assert delta.ipset_delete["KUBE-EXTERNAL-IP"] == {("198.51.100.1", "tcp:443")}
    assert delta.services == {(6, "10.96.0.3", 443), (6, "198.51.100.1", 443)}


def test_one_change_among_many_renders_one_service() -> None:
    objs: list[dict[str, Any]] = [NODE]
    for i in range(2000):
        objs += [svc(f"s{i}", f"10.96.{i // 256}.{i % 256}", [HTTP]), eps(f"s{i}", ["10.1.0.1"])]
    tracker = tracker_with("node-a", *objs)
    cache = IpvsCache(CFG)
    table = cache.render(tracker.take().state)
    assert cache.renders == 2000
    tracker.apply(Event("EndpointSlice", EventType.MODIFIED, eps("s7", ["10.1.0.9"])))
    changes = tracker.take()
    updates = cache.updates(changes.state, changes.changed_services, table)
    assert updates is not None
    delta = table.delta(updates)
    assert table.real_servers == 2000
    table.apply(updates)
    assert cache.renders == 2001
    assert delta.services == {(6, "10.96.0.7", 80)}
    added = {n: v for n, v in delta.ipset_add.items() if v}
    assert added == {"KUBE-LOOP-BACK": {("10.1.0.9", "tcp:8080", "10.1.0.9")}}
    assert not delta.add_addresses and not delta.delete_addresses
    assert table.real_servers == 2000
    nothing = cache.updates(tracker.take().state, [], table)
    assert nothing == {} and cache.renders == 2001
