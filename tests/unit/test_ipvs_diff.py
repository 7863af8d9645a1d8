"""IPVS rendering and the diff against the kernel's state, without a kernel."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from pyproxy.backends.ipvs.diff import CurrentDest, CurrentService, plan
from pyproxy.backends.ipvs.render import Desired, IpvsConfig, VirtualServer
from pyproxy.backends.ipvs.table import render
from tests.helpers import endpoint, endpoint_slice, port, service, tracker_with

TCP, UDP = 6, 17
VS = (TCP, "10.96.0.1", 80)


def desired(dests: dict[tuple[str, int], int], sched: str = "rr", timeout: int = 0) -> Desired:
    d = Desired()
    d.services[VS] = VirtualServer(sched, timeout, dests, "ns/s:p cluster IP")
    d.addresses = {"10.96.0.1"}
    return d


def current(
    dests: dict[tuple[str, int], CurrentDest], sched: str = "rr", key: tuple[int, str, int] = VS
) -> dict:
    return {key: CurrentService(sched, 0, dests)}


def test_new_service_and_dests_are_added() -> None:
    p = plan(desired({("10.1.0.1", 8080): 1}), {}, set(), set(), {})
    assert p.add_services == [(VS, "rr", 0)]
    assert p.set_dests == [(VS, ("10.1.0.1", 8080), 1, True)]
    assert p.add_addresses == {"10.96.0.1"}


def test_no_change_is_an_empty_plan() -> None:
    d = desired({("10.1.0.1", 8080): 1})
    p = plan(
        d,
        current({("10.1.0.1", 8080): CurrentDest(1)}),
        {"10.96.0.1"},
        {"10.96.0.1"},
        {n: set(v) for n, v in d.ipsets.items()},
    )
    assert p.empty()


def test_scheduler_or_persistence_change_updates_in_place() -> None:
    p = plan(desired({}, sched="sh", timeout=60), current({}), {"10.96.0.1"}, set(), {})
    assert p.update_services == [(VS, "sh", 60)] and not p.delete_services


def test_removed_tcp_dest_with_connections_drains_at_weight_zero() -> None:
    cur = current(
        {("10.1.0.1", 8080): CurrentDest(1, active=2), ("10.1.0.2", 8080): CurrentDest(1)}
    )
    p = plan(desired({("10.1.0.2", 8080): 1}), cur, {"10.96.0.1"}, set(), {})
    assert p.set_dests == [(VS, ("10.1.0.1", 8080), 0, False)]
    assert p.draining == [(VS, ("10.1.0.1", 8080))] and not p.delete_dests
    # next sync: still draining, weight already 0: nothing more to write
    cur2 = current(
        {("10.1.0.1", 8080): CurrentDest(0, inactive=1), ("10.1.0.2", 8080): CurrentDest(1)}
    )
    p2 = plan(desired({("10.1.0.2", 8080): 1}), cur2, {"10.96.0.1"}, set(), {})
    assert p2.set_dests == [] and p2.draining == [(VS, ("10.1.0.1", 8080))]
    # connections gone: deleted
    cur3 = current({("10.1.0.1", 8080): CurrentDest(0), ("10.1.0.2", 8080): CurrentDest(1)})
    p3 = plan(desired({("10.1.0.2", 8080): 1}), cur3, {"10.96.0.1"}, set(), {})
    assert p3.delete_dests == [(VS, ("10.1.0.1", 8080))]


def test_draining_dest_that_comes_back_gets_its_weight() -> None:
    cur = current({("10.1.0.1", 8080): CurrentDest(0, active=1)})
    p = plan(desired({("10.1.0.1", 8080): 1}), cur, {"10.96.0.1"}, set(), {})
    assert p.set_dests == [(VS, ("10.1.0.1", 8080), 1, False)]


def test_udp_dest_is_deleted_at_once() -> None:
    key = (UDP, "10.96.0.1", 53)
    d = Desired()
    d.services[key] = VirtualServer("rr", 0, {}, "x")
    p = plan(d, current({("10.1.0.1", 5353): CurrentDest(1, active=5)}, key=key), set(), set(), {})
    assert p.delete_dests == [(key, ("10.1.0.1", 5353))] and not p.draining


def test_only_our_virtual_servers_are_deleted() -> None:
    cur = {**current({}), (TCP, "192.0.2.1", 80): CurrentService("rr", 0, {})}
    p = plan(Desired(), cur, {"10.96.0.1"}, {"10.96.0.1"}, {})
    assert p.delete_services == [VS]
    assert p.delete_addresses == {"10.96.0.1"}


def test_render_policies_and_affinity() -> None:
    objs = [
        service(
            "ns",
            "web",
            "10.96.0.10",
            [port("http", 80, nodePort=30080)],
            type="NodePort",
            externalTrafficPolicy="Local",
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 99}},
        ),
        endpoint_slice(
            "ns",
            "web",
            "w",
            [endpoint("10.1.0.1", node="n1"), endpoint("10.1.0.2", node="n2")],
            [port("http", 8080)],
        ),
    ]
    state = tracker_with("n1", *objs).current_state()
    local = (ipaddress.ip_address("192.168.0.5"), ipaddress.ip_address("127.0.0.1"))
    state = replace(state, node=state.node.with_local_addresses(local))
    d = render(state, IpvsConfig())
    cluster = d.services[(TCP, "10.96.0.10", 80)]
    nodeport = d.services[(TCP, "192.168.0.5", 30080)]
    assert set(cluster.dests) == {("10.1.0.1", 8080), ("10.1.0.2", 8080)}
    assert set(nodeport.dests) == {("10.1.0.1", 8080)}  # eTP=Local: this node's only
    assert cluster.timeout == 99 == nodeport.timeout
    assert d.addresses == {"10.96.0.10"}  # node addresses are not bound to kube-ipvs0
    assert (TCP, "127.0.0.1", 30080) not in d.services  # IPVS has no loopback NodePorts
    assert d.ipsets["KUBE-NODE-PORT-LOCAL-TCP"] == {(30080,)}
    assert ("10.96.0.10", "tcp:80") in d.ipsets["KUBE-CLUSTER-IP"]
    assert "TCP  10.96.0.10:80 rr persistent 99" in d.listing()


def test_ipv6_set_names_follow_upstream_and_fit_the_kernel_limit() -> None:
    from pyproxy.backends.ipvs.render import family_sets, set_name
    from pyproxy.model.types import IPFamily

    assert set_name("KUBE-CLUSTER-IP", IPFamily.IPV6) == "KUBE-6-CLUSTER-IP"
    assert set_name("KUBE-CLUSTER-IP", IPFamily.IPV4) == "KUBE-CLUSTER-IP"
    assert all(len(n) <= 31 for n in family_sets(IPFamily.IPV6))
    assert "KUBE-6-LOAD-BALANCER-SOURCE-CID" in family_sets(IPFamily.IPV6)
