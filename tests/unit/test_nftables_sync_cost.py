"""nftables mode: a sync's transaction holds what changed, not the cluster. Counted, never timed.

A real tracker, syncer and nftables backend over 2,000 services, with libnftables replaced by
one that records the transactions it is given and counts listings (unit tests of the sync
logic; ``tests/netns/test_nftables.py`` proves the same transactions in a kernel).
"""

from __future__ import annotations

from pyproxy.backends.nftables import names
from pyproxy.backends.nftables.backend import NftablesBackend, _Family
from pyproxy.backends.nftables.table import Renderer
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.nft import Nft
from pyproxy.model.events import KINDS, Event, EventType
from pyproxy.model.types import IPFamily, NamespacedName, Protocol, ServicePortName
from pyproxy.sync.syncer import Syncer
from pyproxy.sync.tracker import ChangeTracker
from tests.helpers import port, service
from tests.unit.test_sync_cost import objects, slice_of

N = 2_000
T = "ip kube-proxy"


class RecordingNft(Nft):
    """Takes transactions; answers listings as an empty kernel would, and counts them."""

    def __init__(self) -> None:
        self.how = "recording"
        self.runs: list[str] = []
        self.listings = 0

    def usable(self) -> str | None:
        return None

    def run(self, text: str, flags: int = 0, fresh: bool = False) -> str:
        self.runs.append(text)
        return ""

    def names(self, family: str, table: str) -> dict[str, set[str]]:
        self.listings += 1
        return {"chain": set(), "set": set(), "map": set()}

    def tables(self) -> set[tuple[str, str]]:
        self.listings += 1
        return set()


def world() -> tuple[ChangeTracker, Syncer, RecordingNft]:
    tracker = ChangeTracker("node-a")
    objs = objects(N)
    for kind in KINDS:
        tracker.apply(
            Event(kind, EventType.REPLACE, objects=[o for o in objs if o["kind"] == kind])
        )
        tracker.apply(Event(kind, EventType.SYNCED))
    backend = NftablesBackend(ProxyConfig())
    nft = RecordingNft()
    cfg = backend.configs[IPFamily.IPV4]
    backend._nft, backend._families = nft, [_Family(cfg, Renderer(cfg))]
    syncer = Syncer(tracker, backend)
    syncer.sync()
    assert syncer.stats.full_syncs == 1
    assert sum(t.count("add rule ") for t in nft.runs) > N  # the full sync wrote everything
    nft.runs.clear()
    nft.listings = 0
    return tracker, syncer, nft


def chain(i: int) -> str:
    spn = ServicePortName(NamespacedName("bench", f"svc-{i}"), "http", Protocol.TCP)
    return names.SERVICE + names.port_base(spn)


def commands(nft: RecordingNft) -> list[str]:
    (text,) = nft.runs  # one transaction
    return text.splitlines()


def test_an_endpoint_change_is_one_small_transaction_without_listing() -> None:
    tracker, syncer, nft = world()
    tracker.apply(Event("EndpointSlice", EventType.MODIFIED, slice_of(77, ["10.200.0.1"])))
    syncer.sync()
    assert commands(nft) == [
        f"add chain {T} {chain(77)}",
        f"flush chain {T} {chain(77)}",
        f"add rule {T} {chain(77)} meta l4proto tcp dnat ip addr . port to "
        "numgen random mod 1 map { 0 : 10.200.0.1 . 8080 }",
    ]
    assert nft.listings == 0  # nothing read back from the kernel
    assert syncer.stats.full_syncs == 1


def test_a_new_service_adds_its_chain_and_elements() -> None:
    tracker, syncer, nft = world()
    new = service("bench", "svc-2000", "10.99.0.1", [port("http", 80)])
    tracker.apply(Event("Service", EventType.ADDED, new))
    tracker.apply(Event("EndpointSlice", EventType.ADDED, slice_of(2000, ["10.200.0.2"])))
    syncer.sync()
    assert sorted(commands(nft)) == sorted([
        f"add element {T} cluster-ips {{ 10.99.0.1 }}",
        f"add element {T} service-ips {{ 10.99.0.1 . tcp . 80 : goto {chain(2000)} }}",
        f"add chain {T} {chain(2000)}",
        f"flush chain {T} {chain(2000)}",
        f"add rule {T} {chain(2000)} meta l4proto tcp dnat ip addr . port to "
        "numgen random mod 1 map { 0 : 10.200.0.2 . 8080 }",
    ])  # fmt: skip
    assert nft.listings == 0


def test_a_deleted_service_loses_its_elements_and_its_chain_is_flushed() -> None:
    tracker, syncer, nft = world()
    tracker.apply(Event("Service", EventType.DELETED, objects(N)[2 * 5]))
    syncer.sync()
    # The chain is emptied now and deleted by a later sync (upstream waits, so a packet
    # already on its way through the chain does not meet a missing one).
    assert sorted(commands(nft)) == sorted([
        f"flush chain {T} {chain(5)}",
        f"delete element {T} cluster-ips {{ 10.96.0.5 }}",
        f"delete element {T} service-ips {{ 10.96.0.5 . tcp . 80 }}",
    ])  # fmt: skip
    assert nft.listings == 0


def test_an_idle_sync_writes_nothing() -> None:
    _, syncer, nft = world()
    for _ in range(3):
        syncer.sync()
    assert nft.runs == []
    assert nft.listings == 0
