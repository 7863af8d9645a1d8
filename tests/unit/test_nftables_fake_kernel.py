"""nftables mode against the checking fake of the nft port: every transaction a sync writes
(full, partial, the deletion of stale chains) must be one the kernel takes, and after any
run of partial syncs the fake holds what one full sync of the same objects writes into an
empty kernel. The fake refuses what this machine's kernel refuses
(``tests/netns/test_nft_refusals.py``); ``tests/netns/test_nftables.py`` runs the same mode
on the kernel itself."""

from __future__ import annotations

from typing import Any

import pytest

from pyproxy.backends.nftables.backend import NftablesBackend
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.nft_fake import FakeNft, Table
from pyproxy.model.events import Event, EventType
from pyproxy.sync.syncer import Syncer
from tests.helpers import tracker_with
from tests.unit.sync_steps import START, STEPS, Clock, apply, eps, key, svc


def kernel(objs: list[dict[str, Any]], cfg: ProxyConfig | None = None) -> Table:
    """What one full sync of ``objs`` writes into an empty kernel."""
    nft = FakeNft()
    syncer = Syncer(tracker_with("node-a", *objs), NftablesBackend(
        cfg or ProxyConfig(), nft=nft, delete_conntrack=lambda f, v6: 0))  # fmt: skip
    syncer.sync()
    return nft.table("ip", "kube-proxy")


@pytest.mark.parametrize("service_metrics", [False, True], ids=["plain", "counters"])
def test_partial_syncs_leave_the_kernel_a_full_sync_would_write(service_metrics: bool) -> None:
    """With --service-metrics, each service port's DNAT rules use a named counter, which
    the kernel will not delete while a rule uses it."""
    cfg = ProxyConfig(service_metrics=service_metrics)
    objs = {key(o): o for o in START}
    tracker = tracker_with("node-a", *START)
    nft, clock, cleared = FakeNft(), Clock(), []
    backend = NftablesBackend(cfg, nft=nft, clock=clock,
                              delete_conntrack=lambda f, v6: cleared.append(f) or 0)  # fmt: skip
    syncer = Syncer(tracker, backend)
    syncer.sync()
    assert nft.table("ip", "kube-proxy") == kernel(list(objs.values()), cfg)
    assert bool(nft.table("ip", "kube-proxy").counters) == service_metrics
    for what, changed, deleted in STEPS:
        fulls = syncer.stats.full_syncs
        apply(tracker, objs, changed, deleted)
        syncer.sync()
        clock.now += 2  # stale chains are deleted a second after they were flushed
        syncer.sync()
        assert syncer.stats.full_syncs == fulls, f"{what}: the sync was not partial"
        assert nft.table("ip", "kube-proxy") == kernel(list(objs.values()), cfg), what
    assert cleared  # the UDP port change cleared its stale flows


def test_a_partial_transaction_the_kernel_refuses_falls_back_to_a_full_one() -> None:
    tracker = tracker_with("node-a", *START)
    nft, clock = FakeNft(), Clock()
    syncer = Syncer(tracker, NftablesBackend(ProxyConfig(), nft=nft, clock=clock,
                                             delete_conntrack=lambda f, v6: 0))  # fmt: skip
    syncer.sync()
    # Someone deletes service a's elements behind pyproxy's back: deleting them again, as
    # the partial sync for a's deletion does, is refused.
    t = nft.table("ip", "kube-proxy")
    t.sets["cluster-ips"].elements.pop("10.96.0.1")
    t.sets["service-ips"].elements.pop("10.96.0.1 . tcp . 80")
    tracker.apply(Event("Service", EventType.DELETED, svc("a", "10.96.0.1")))
    tracker.apply(Event("EndpointSlice", EventType.DELETED, eps("a", [])))
    syncer.sync()  # no exception: the sync succeeded
    assert syncer.stats.full_syncs == 2
    assert syncer.last_full_reason.startswith("a partial write failed: "), syncer.last_full_reason
    assert "No such file or directory" in syncer.last_full_reason
    clock.now += 2
    syncer.sync()  # deletes the chains the full sync flushed
    objs = [o for o in START if o["metadata"]["name"] not in ("a", "a-1")]
    assert nft.table("ip", "kube-proxy") == kernel(objs)
