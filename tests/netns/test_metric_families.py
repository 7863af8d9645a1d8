"""iptables mode's own metric families move with a sync that writes a service.

Its own module because ``kubeproxy_sync_proxy_rules_iptables_last`` counts the rules the last
sync wrote, and a partial sync with nothing to write writes none: beside
``test_operations.py``'s one-second sync period, an idle sync could land between the service's
sync and the scrape and set it back to 0 (it did, once, in CI). Here the sync period is an
hour, so the only syncs are the ones this test causes."""

from __future__ import annotations

import pytest

from tests.netns.scrape import check_mode_families, get, metric, scrape
from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import Pyproxy, World, manifest_objects, wait_for

pytestmark = pytest.mark.netns
PYPROXY_FLAGS = ("--metrics-bind-address", "127.0.0.1:10249", "--sync-period", "1h")


def test_metric_families_are_the_modes_own(world: World, proxy: Pyproxy) -> None:
    wait_for(lambda: get(world, "http://127.0.0.1:10249/metrics")["code"] == 200, what="metrics")
    nat = '{ip_family="IPv4",table="nat"}'
    before = scrape(world)
    check_mode_families(before, "iptables")
    full = 'kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}'
    partial = 'kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}'
    proxy.write(
        "fam", *manifest_objects(world, svc("fam", "10.96.5.9", [HTTP]), pods(world, 1), HTTP_EP)
    )
    reachable(world, "10.96.5.9")
    after = wait_for(
        lambda: (
            lambda t: (
                t
                if metric(t, "kubeproxy_sync_proxy_rules_iptables_total", nat)
                > metric(before, "kubeproxy_sync_proxy_rules_iptables_total", nat)
                else None
            )
        )(scrape(world)),
        what="the nat rule count to grow",
    )
    assert metric(after, "kubeproxy_sync_proxy_rules_iptables_last", nat) > 0
    assert metric(after, full) + metric(after, partial) > metric(before, full) + metric(
        before, partial
    )
