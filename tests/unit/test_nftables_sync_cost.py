"""nftables mode: a sync's transaction holds what changed, not the cluster. Counted, never timed.

A real tracker, syncer and nftables backend over 2,000 services, with libnftables replaced by
the checking fake of the nft port, which refuses what the kernel refuses, records the
transactions it takes and counts listings (unit tests of the sync logic;
``tests/netns/test_nftables.py`` proves the same transactions in a kernel).
"""

from __future__ import annotations

import pytest

from pyproxy.backends.base import BackendError
from pyproxy.backends.nftables import names
from pyproxy.backends.nftables import transactions as tx
from pyproxy.backends.nftables.backend import NftablesBackend
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.nft import NftError
from pyproxy.kernel.nft_fake import FakeNft
from pyproxy.model.events import KINDS, Event, EventType
from pyproxy.model.types import IPFamily, NamespacedName, Protocol, ServicePortName
from pyproxy.sync.syncer import Syncer
from pyproxy.sync.tracker import ChangeTracker
from tests.helpers import no_conntrack, objects, port, service, slice_of

N = 2_000
T = "ip kube-proxy"


def world() -> tuple[ChangeTracker, Syncer, FakeNft]:
    tracker = ChangeTracker("node-a")
    objs = objects(N)
    for kind in KINDS:
        tracker.apply(
            Event(kind, EventType.REPLACE, objects=[o for o in objs if o["kind"] == kind])
        )
        tracker.apply(Event(kind, EventType.SYNCED))
    nft = FakeNft()
    backend = NftablesBackend(ProxyConfig(), nft=nft, delete_conntrack=no_conntrack)
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


def commands(nft: FakeNft) -> list[str]:
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


class RefusingNft(FakeNft):
    """Refuses the next ``refuse`` transactions whatever they hold (nothing of a refused
    transaction is applied)."""

    refuse = 0

    def run(self, text: str, flags: int = 0, fresh: bool = False) -> str:
        if self.refuse > 0:
            self.refuse -= 1
            raise NftError("Error: Could not process rule: No such file or directory")
        return super().run(text, flags, fresh)


def test_a_partial_transaction_changes_nothing_before_the_kernel_accepts_it() -> None:
    """Building the transaction must leave the table and the mirror as they are: the kernel
    may refuse it."""
    tracker, syncer, _ = world()
    backend = syncer.backend
    assert isinstance(backend, NftablesBackend)
    fam = backend.writers()[0]
    assert fam.family is IPFamily.IPV4
    programmed = backend.programmed(IPFamily.IPV4)
    assert programmed is not None
    tracker.apply(Event("Service", EventType.DELETED, objects(N)[2 * 5]))
    changes = tracker.take()
    updates = fam.cache.updates(changes.state, changes.changed_services, programmed)
    assert updates
    entries, elements = dict(programmed.entries), dict(fam.mirror.elements)
    contributions = {k: dict(v) for k, v in programmed.contributions.items()}
    written = tx.partial(programmed, updates, fam.mirror)
    assert f"flush chain {T} {chain(5)}" in written.text.splitlines()
    assert programmed.entries == entries and fam.mirror.elements == elements
    assert {k: dict(v) for k, v in programmed.contributions.items()} == contributions
    assert fam.mirror.stale_chains == {}


def test_a_refused_sync_leaves_the_view_and_the_next_one_repairs_it() -> None:
    tracker, syncer, _ = world()
    backend = syncer.backend
    assert isinstance(backend, NftablesBackend)
    nft = RefusingNft()
    refusing = NftablesBackend(ProxyConfig(), nft=nft, delete_conntrack=no_conntrack)
    syncer = Syncer(tracker, refusing)
    syncer.sync()
    fam = refusing.writers()[0]
    assert fam.family is IPFamily.IPV4
    before = dict(fam.mirror.elements)
    nft.runs.clear()
    tracker.apply(Event("Service", EventType.DELETED, objects(N)[2 * 5]))
    nft.refuse = 2  # the partial transaction, then the full one it falls back to
    with pytest.raises(BackendError):
        syncer.sync()
    assert nft.runs == []
    # Nothing was flushed, nothing is waiting to be deleted, the elements are as written.
    assert fam.mirror.stale_chains == {} and fam.mirror.elements == before
    syncer.sync()  # the kernel takes it now: a full sync, without the deleted service
    (text,) = [t for t in nft.runs if t.startswith(f"add table {T} ")]
    assert syncer.last_full_reason == "previous sync failed"
    assert f"add element {T} cluster-ips {{ 10.96.0.5 }}" not in text.splitlines()
    assert f"add element {T} cluster-ips {{ 10.96.0.6 }}" in text.splitlines()
    assert ("cluster-ips", ("10.96.0.5",)) not in fam.mirror.elements
    assert ("cluster-ips", ("10.96.0.6",)) in fam.mirror.elements
