"""IPVS mode against the checking fakes of its kernel ports (IPVS, ipsets and addresses;
xtables): every call a sync makes must be one the kernel takes, and after any run of partial
syncs the fakes hold what one full sync of the same objects writes into an empty kernel. The
IPVS fake refuses what the real IPVS of the user-mode Linux guest refuses (this kernel has
none; ``tests/ipvs_refusals.py``), and the guest runs the same mode on it."""

from __future__ import annotations

from typing import Any

from pyproxy.backends.base import ServiceTraffic
from pyproxy.backends.ipvs.backend import IpvsBackend
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.iptables_fake import FakeIptables
from pyproxy.kernel.ipvs import Stats
from pyproxy.kernel.ipvs_fake import FakeIpvsKernel
from pyproxy.model.events import Event, EventType
from pyproxy.model.types import IPFamily
from pyproxy.sync.syncer import Syncer
from tests.helpers import tracker_with
from tests.unit.sync_steps import START, STEPS, apply, eps, key, svc


def backend(k: FakeIpvsKernel, cleared: list[Any] | None = None) -> IpvsBackend:
    def delete_conntrack(filters: Any, ipv6: bool) -> int:
        if cleared is not None:
            cleared.append(filters)
        return 0

    return IpvsBackend(ProxyConfig(), tables={IPFamily.IPV4: FakeIptables()}, kernel=k,
                       delete_conntrack=delete_conntrack,
                       sysctls=lambda *a, **kw: None)  # fmt: skip


def held(k: FakeIpvsKernel) -> dict[str, Any]:
    return {
        "virtual servers": {
            key: (vs.spec, dict(vs.dests)) for key, vs in k.virtual_servers.items()
        },
        "ipsets": {name: (s.stype, set(s.members)) for name, s in k.sets.items()},
        "addresses": k.dummy,
    }


def kernel(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """What one full sync of ``objs`` writes into an empty kernel."""
    k = FakeIpvsKernel()
    Syncer(tracker_with("node-a", *objs), backend(k)).sync()
    return held(k)


def test_partial_syncs_leave_the_kernel_a_full_sync_would_write() -> None:
    objs = {key(o): o for o in START}
    tracker = tracker_with("node-a", *START)
    k, cleared = FakeIpvsKernel(), []
    syncer = Syncer(tracker, backend(k, cleared))
    syncer.sync()
    assert held(k) == kernel(list(objs.values()))
    assert (6, "172.31.0.10", 30080) in k.virtual_servers  # NodePorts on the node's address
    for what, changed, deleted in STEPS:
        fulls = syncer.stats.full_syncs
        apply(tracker, objs, changed, deleted)
        syncer.sync()
        assert syncer.stats.full_syncs == fulls, f"{what}: the sync was not partial"
        assert held(k) == kernel(list(objs.values())), what
    assert cleared  # the UDP port change cleared its stale flows


def test_a_removed_endpoint_with_connections_drains_then_goes() -> None:
    tracker = tracker_with("node-a", *START)
    k = FakeIpvsKernel()
    syncer = Syncer(tracker, backend(k))
    syncer.sync()
    vs, gone = (6, "10.96.0.1", 80), ("10.1.0.2", 8080)
    k.connections[(vs, gone)] = (1, 0)
    slice_a = next(o for o in START if key(o) == ("EndpointSlice", "a-1"))
    fewer = {**slice_a, "endpoints": slice_a["endpoints"][:1]}
    tracker.apply(Event("EndpointSlice", EventType.MODIFIED, fewer))
    syncer.sync()
    assert k.virtual_servers[vs].dests == {("10.1.0.1", 8080): 1, gone: 0}  # draining
    syncer.sync()
    assert k.virtual_servers[vs].dests[gone] == 0  # still open: still there
    del k.connections[(vs, gone)]
    syncer.sync()
    assert k.virtual_servers[vs].dests == {("10.1.0.1", 8080): 1}
    assert syncer.stats.full_syncs == 1


def test_a_partial_write_ipvs_refuses_falls_back_to_a_full_one() -> None:
    tracker = tracker_with("node-a", *START)
    k = FakeIpvsKernel()
    syncer = Syncer(tracker, backend(k))
    syncer.sync()
    del k.virtual_servers[(6, "10.96.0.1", 80)]  # someone deleted a's virtual server
    tracker.apply(Event("Service", EventType.DELETED, svc("a", "10.96.0.1")))
    syncer.sync()
    assert syncer.stats.full_syncs == 2
    assert syncer.last_full_reason.startswith("a partial write failed: "), syncer.last_full_reason
    assert held(k) == kernel([o for o in START if key(o) != ("Service", "a")])


def test_a_virtual_server_two_services_claim_follows_the_last_in_name_order() -> None:
    """A render writes services in name order, so of two services claiming one address and
    port the later one's real servers are the virtual server's; partial syncs agree."""
    objs = {key(o): o for o in START}
    tracker = tracker_with("node-a", *START)
    k = FakeIpvsKernel()
    syncer = Syncer(tracker, backend(k))
    syncer.sync()
    claim = [svc("h", "10.96.0.9", externalIPs=["10.96.0.1"]), eps("h", ["10.1.0.99"])]
    for o in claim:
        objs[key(o)] = o
        tracker.apply(Event(o["kind"], EventType.ADDED, o))
    syncer.sync()
    assert k.virtual_servers[(6, "10.96.0.1", 80)].dests == {("10.1.0.99", 8080): 1}
    assert held(k) == kernel(list(objs.values()))
    for o in claim:
        objs.pop(key(o))
        tracker.apply(Event(o["kind"], EventType.DELETED, o))
    syncer.sync()
    assert k.virtual_servers[(6, "10.96.0.1", 80)].dests == {("10.1.0.1", 8080): 1,
                                                              ("10.1.0.2", 8080): 1}  # fmt: skip
    assert held(k) == kernel(list(objs.values()))
    assert syncer.stats.full_syncs == 1


def test_service_traffic_sums_a_service_ports_virtual_servers() -> None:
    """A NodePort service's cluster IP and node-port virtual servers count for its one
    service port; another service's are its own."""
    k = FakeIpvsKernel()
    b = backend(k)
    Syncer(tracker_with("node-a", *START), b).sync()
    k.stats[(6, "10.96.0.2", 80)] = Stats(connections=3, packets_in=10, bytes_in=1000)
    k.stats[(6, "172.31.0.10", 30080)] = Stats(connections=2, packets_out=5, bytes_out=500)
    k.stats[(6, "10.96.0.1", 80)] = Stats(connections=7)
    traffic = b.service_traffic()
    assert traffic["ns/b:http"] == ServiceTraffic(5, 15, 1500)
    assert traffic["ns/a:http"] == ServiceTraffic(7, 0, 0)
