"""ebpf mode's socket map, synced by the shared engine through the checking fake map: a
one-service change at 10,000 services writes only that service's entries, an idle sync
writes nothing, a reader never finds a head whose slots are not written yet (or gone), a
full sync adopts a pinned map (its stale keys of the family go, the other family's stay),
and a refused write leaves the next sync full. Counted, never timed."""

from __future__ import annotations

import ipaddress
import zlib
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from pyproxy.backends.base import BackendError, SyncRequest
from pyproxy.backends.ebpf import layout
from pyproxy.backends.ebpf.backend import EbpfBackend
from pyproxy.backends.ebpf.writer import SocketFamily, SocketMaps
from pyproxy.backends.engine.engine import Engine
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.bpf_fake import FakeMap
from pyproxy.kernel.nft_fake import FakeNft
from pyproxy.model.events import KINDS, Event, EventType
from pyproxy.model.types import IPFamily, NamespacedName, Protocol, ProxyState
from pyproxy.sync.syncer import Syncer
from pyproxy.sync.tracker import ChangeTracker
from tests.helpers import endpoint, endpoint_slice, no_conntrack, objects, port, service, slice_of

ip = ipaddress.ip_address


def tracker(objs: list[dict[str, Any]]) -> ChangeTracker:
    t = ChangeTracker("node-a")
    for kind in KINDS:
        t.apply(Event(kind, EventType.REPLACE, objects=[o for o in objs if o["kind"] == kind]))
        t.apply(Event(kind, EventType.SYNCED))
    return t


def engine(m: FakeMap, members: FakeMap | None = None) -> tuple[Engine[Any], SocketFamily]:
    members = members or FakeMap(layout.MEMBER_KEY_SIZE, 4, 1 << 20)
    cfg = ProxyConfig().with_options(bpf_socket_affinity=True)  # the members map's test
    writer = SocketFamily(IPFamily.IPV4, SocketMaps(m, members), cfg)
    return Engine([writer], no_conntrack), writer


def sync(e: Engine[Any], state: ProxyState, changed: set[NamespacedName] | None = None) -> bool:
    full = changed is None
    return e.sync(state, SyncRequest(state, frozenset(changed or ()), full=full)).full


def head_count(m: FakeMap, vip: str, port_: int) -> int | None:
    value = m.entries.get(layout.key(ip(vip), port_, Protocol.TCP, 0))
    return None if value is None else int.from_bytes(value[20:24], "little")


def new_map() -> FakeMap:
    return FakeMap(layout.KEY_SIZE, layout.VALUE_SIZE, 1 << 20)


def test_a_one_service_change_at_10000_services_writes_that_services_entries_only() -> None:
    t = tracker(objects(10_000))
    m = new_map()
    e, _ = engine(m)
    sync(e, t.current_state())
    assert len(m.entries) == 10_000 * 3  # a head and two endpoints each
    assert head_count(m, "10.96.0.7", 80) == 2
    m.updates = m.deletes = 0
    svc = NamespacedName("bench", "svc-7")
    t.apply(Event("EndpointSlice", EventType.MODIFIED,
                  obj=slice_of(7, ["10.128.7.1", "10.128.7.2", "10.128.7.3"])))  # fmt: skip
    assert sync(e, t.current_state(), {svc}) is False
    # that service's three slots and its head, nothing of the 9,999 others
    assert (m.updates, m.deletes) == (4, 0)
    assert head_count(m, "10.96.0.7", 80) == 3
    m.updates = 0
    assert sync(e, t.current_state(), {svc}) is False
    assert (m.updates, m.deletes) == (0, 0)


def test_slots_are_written_before_their_head_and_deleted_after_it() -> None:
    def web_slice(eps: list[dict[str, Any]]) -> dict[str, Any]:
        return endpoint_slice("ns", "web", "web-1", eps, [port("http", 8080)])

    objs = [service("ns", "web", "10.96.0.10", [port("http", 80)]),
            web_slice([endpoint("10.244.0.1")])]  # fmt: skip
    t = tracker(objs)
    m = new_map()
    e, _ = engine(m)
    sync(e, t.current_state())
    web = NamespacedName("ns", "web")

    def slots(log: list[tuple[str, bytes]]) -> list[tuple[str, int]]:
        return [(op, layout.slot_of(k)) for op, k in log]

    m.log.clear()
    three = [endpoint(f"10.244.0.{i}") for i in (1, 2, 3)]
    t.apply(Event("EndpointSlice", EventType.MODIFIED, obj=web_slice(three)))
    sync(e, t.current_state(), {web})
    assert slots(m.log) == [("update", 1), ("update", 2), ("update", 3), ("update", 0)]
    m.log.clear()
    t.apply(Event("EndpointSlice", EventType.MODIFIED, obj=web_slice(three[:1])))
    sync(e, t.current_state(), {web})
    assert slots(m.log) == [("update", 1), ("update", 0), ("delete", 2), ("delete", 3)]
    m.log.clear()
    t.apply(Event("Service", EventType.DELETED, obj=objs[0]))
    sync(e, t.current_state(), {web})
    assert slots(m.log) == [("delete", 0), ("delete", 1)]
    assert m.entries == {}


def test_a_full_sync_adopts_a_pinned_map() -> None:
    t = tracker(objects(3))
    m = new_map()
    stale = layout.key(ip("10.96.9.9"), 80, Protocol.TCP, 0)
    other_family = layout.key(ip("fd00::9"), 80, Protocol.TCP, 0)
    m.entries = {stale: layout.head(1), other_family: layout.head(1)}
    e, _ = engine(m)
    sync(e, t.current_state())
    assert stale not in m.entries and other_family in m.entries
    assert len(m.entries) == 3 * 3 + 1


def test_a_refused_write_makes_the_next_sync_full() -> None:
    t = tracker(objects(3))
    m = FakeMap(layout.KEY_SIZE, layout.VALUE_SIZE, 9)
    e, _ = engine(m)
    sync(e, t.current_state())
    t.apply(Event("EndpointSlice", EventType.MODIFIED,
                  obj=slice_of(1, ["10.128.1.1", "10.128.1.2", "10.128.1.3"])))  # fmt: skip
    svc = NamespacedName("bench", "svc-1")
    try:
        sync(e, t.current_state(), {svc})
    except Exception as err:  # the engine's BackendError, after its fallback full sync failed
        assert "socket map write failed" in str(err)
    else:
        raise AssertionError("a map with no room accepted a tenth entry")
    m.max_entries = 100
    assert sync(e, t.current_state(), {svc}) is True
    assert head_count(m, "10.96.0.1", 80) == 3


def test_affinity_endpoints_are_members_while_they_have_a_slot() -> None:
    """A remembered endpoint is used only while it is a member: it becomes one before its
    slot is written and stops being one after its slot is gone."""

    def web(*ips: str) -> dict[str, Any]:
        eps = [endpoint(i) for i in ips]
        return endpoint_slice("ns", "web", "web-1", eps, [port("http", 8080)])

    sticky = service("ns", "web", "10.96.0.10", [port("http", 80)],
                     sessionAffinity="ClientIP")  # fmt: skip
    t = tracker([sticky, web("10.244.0.1", "10.244.0.2")])
    m, members = new_map(), FakeMap(layout.MEMBER_KEY_SIZE, 4, 1 << 20)
    e, _ = engine(m, members)
    sync(e, t.current_state())

    def member(ep: str) -> bytes:
        return layout.member(ip("10.96.0.10"), 80, Protocol.TCP, ip(ep), 8080)

    assert set(members.entries) == {member("10.244.0.1"), member("10.244.0.2")}
    m.log.clear()
    members.log.clear()
    t.apply(Event("EndpointSlice", EventType.MODIFIED, obj=web("10.244.0.1")))
    sync(e, t.current_state(), {NamespacedName("ns", "web")})
    assert set(members.entries) == {member("10.244.0.1")}
    assert members.log == [("update", member("10.244.0.1")), ("delete", member("10.244.0.2"))]
    assert [(op, layout.slot_of(k)) for op, k in m.log] == [("update", 1), ("update", 0),
                                                            ("delete", 2)]  # fmt: skip


class OrderedNft(FakeNft):
    """The checking nftables fake, noting each transaction in the shared order."""

    def __init__(self, order: list[str]) -> None:
        super().__init__()
        self.order = order

    def run(self, text: str, flags: int = 0, fresh: bool = False) -> str:
        self.order.append("nft")
        return super().run(text, flags, fresh)


class OrderedMap(FakeMap):
    def __init__(self, order: list[str]) -> None:
        super().__init__(layout.KEY_SIZE, layout.VALUE_SIZE, 1 << 20)
        self.order = order

    def update(self, key: bytes, value: bytes) -> None:
        self.order.append("map")
        super().update(key, value)


def test_a_change_reaches_the_socket_map_before_the_nftables_transaction() -> None:
    """The map is what a change in this mode is measured by: it is written first, and the
    sync reports how long after the tracker saw the change its entries were in the map."""
    order: list[str] = []
    members = FakeMap(layout.MEMBER_KEY_SIZE, 4, 1 << 20)
    t = tracker(objects(3))
    backend = EbpfBackend(ProxyConfig(), nft=OrderedNft(order), delete_conntrack=no_conntrack,
                          maps=SocketMaps(OrderedMap(order), members))  # fmt: skip
    syncer = Syncer(t, backend)
    syncer.sync()
    order.clear()
    t.apply(Event("EndpointSlice", EventType.MODIFIED, slice_of(1, ["10.200.0.1"])))
    syncer.sync()
    assert order[0] == "map" and "nft" in order
    assert order.index("nft") > max(i for i, what in enumerate(order) if what == "map")
    (last,) = backend.debug_state()["socketMapWrites"][-1:]
    assert last["full"] is False
    assert 0 <= last["seconds"] <= last["seenToMapSeconds"]
    registry = CollectorRegistry()
    backend.register_metrics(registry)
    assert registry.get_sample_value("pyproxy_socket_map_write_seconds",
                                     {"kind": "partial"}) == last["seconds"]  # fmt: skip
    assert registry.get_sample_value("pyproxy_socket_map_seen_to_written_seconds") == last[
        "seenToMapSeconds"]  # fmt: skip


class Counts:
    """The counts map port: per-CPU values for the keys it was given."""

    def __init__(self, values: dict[bytes, list[int]]) -> None:
        self.values = values

    def lookup_percpu(self, key: bytes) -> list[bytes] | None:
        per_cpu = self.values.get(key)
        return None if per_cpu is None else [n.to_bytes(8, "little") for n in per_cpu]


def test_the_programs_counts_are_reported_per_service_port() -> None:
    """Each programmed service port's count, summed over CPUs and named by the service
    port whose head carries its id; a port the programs never sent anything to is absent."""
    t = tracker(objects(3))
    state = t.current_state()
    name = next(str(sp.name) for sp in state.sorted_services(IPFamily.IPV4)
                if sp.name.service.name == "svc-1")  # fmt: skip
    ident = zlib.crc32(name.encode())
    backend = EbpfBackend(ProxyConfig(), nft=FakeNft(), delete_conntrack=no_conntrack,
                          maps=SocketMaps(new_map(), FakeMap(layout.MEMBER_KEY_SIZE, 4, 1 << 20)),
                          counts=Counts({layout.count_key(ident): [3, 4]}))  # fmt: skip
    Syncer(t, backend).sync()
    traffic = backend.service_traffic()
    assert {k: v.connections for k, v in traffic.items()} == {name: 7}
    assert traffic[name].packets is None


def test_a_refused_map_write_still_syncs_the_rules_and_then_fails() -> None:
    """The map is full: the nftables transaction is still written (the rules serve every
    service meanwhile), the sync fails so the syncer retries it in full."""
    order: list[str] = []
    full_map = FakeMap(layout.KEY_SIZE, layout.VALUE_SIZE, 2)  # room for less than one service
    t = tracker(objects(3))
    members = FakeMap(layout.MEMBER_KEY_SIZE, 4, 1 << 20)
    nft = OrderedNft(order)
    backend = EbpfBackend(ProxyConfig(), nft=nft, delete_conntrack=no_conntrack,
                          maps=SocketMaps(full_map, members))  # fmt: skip
    syncer = Syncer(t, backend)
    with pytest.raises(BackendError, match="the nftables rules were synced"):
        syncer.sync()
    chains = nft.table("ip", "kube-proxy").chains
    services = sorted(c.split("/")[1] for c in chains if c.startswith("service-") and "/" in c)
    assert services == ["svc-0", "svc-1", "svc-2"]  # every service's rules were written
    assert syncer.stats.failures == 1
