"""iptables mode against the checking fake of the xtables port: every restore a sync writes
(full, partial) must be one both iptables back ends take, and after any run of partial syncs
the fake holds the rules one full sync of the same objects writes into empty tables (in the
top-level chains a partial sync inserts a changed service's lines at the head, so there the
order differs: the same lines, and the NodePort rule still last in KUBE-SERVICES). The fake
refuses what this machine's tools refuse (``tests/netns/test_xtables_refusals.py``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from pyproxy.backends.base import ServiceTraffic
from pyproxy.backends.iptables.backend import IptablesBackend
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.iptables_fake import FakeIptables
from pyproxy.model.events import Event, EventType
from pyproxy.model.types import IPFamily
from pyproxy.sync.syncer import Syncer
from tests.helpers import tracker_with
from tests.unit.sync_steps import START, STEPS, apply, eps, key, svc

SERVICE_CHAINS = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-EXT-", "KUBE-FW-")

Tables = dict[str, dict[str, list[str]]]


def backend(ipt: FakeIptables, cleared: list[Any] | None = None) -> IptablesBackend:
    def delete_conntrack(filters: Any, ipv6: bool) -> int:
        if cleared is not None:
            cleared.append(filters)
        return 0

    return IptablesBackend(ProxyConfig(), tables={IPFamily.IPV4: ipt},
                           sysctls=lambda *a, **k: None,
                           delete_conntrack=delete_conntrack)  # fmt: skip


def kernel(objs: list[dict[str, Any]]) -> Tables:
    """What one full sync of ``objs`` writes into empty tables."""
    ipt = FakeIptables()
    Syncer(tracker_with("node-a", *objs), backend(ipt)).sync()
    return ipt.tables


def same(got: Tables, want: Tables, what: str) -> None:
    assert got.keys() == want.keys(), what
    for table in want:
        assert got[table].keys() == want[table].keys(), f"{what}: {table} chains"
        for chain, rules in want[table].items():
            if chain.startswith(SERVICE_CHAINS):
                assert got[table][chain] == rules, f"{what}: {table} {chain}"
            else:
                assert sorted(got[table][chain]) == sorted(rules), f"{what}: {table} {chain}"
    services = want["nat"]["KUBE-SERVICES"]
    assert got["nat"]["KUBE-SERVICES"][-1:] == services[-1:], f"{what}: the NodePort rule"


def test_partial_syncs_leave_the_rules_a_full_sync_would_write() -> None:
    objs = {key(o): o for o in START}
    tracker = tracker_with("node-a", *START)
    ipt, cleared = FakeIptables(), []
    syncer = Syncer(tracker, backend(ipt, cleared))
    syncer.sync()
    assert ipt.tables == kernel(list(objs.values()))
    assert "KUBE-NODEPORTS" in ipt.save("nat")
    for what, changed, deleted in STEPS:
        fulls, restores = syncer.stats.full_syncs, len(ipt.restores)
        apply(tracker, objs, changed, deleted)
        syncer.sync()
        assert syncer.stats.full_syncs == fulls, f"{what}: the sync was not partial"
        assert len(ipt.restores) == restores + 1, f"{what}: one restore"
        same(ipt.tables, kernel(list(objs.values())), what)
    assert cleared  # the UDP port change cleared its stale flows


def test_a_partial_restore_iptables_refuses_falls_back_to_a_full_one() -> None:
    tracker = tracker_with("node-a", *START)
    ipt = FakeIptables()
    syncer = Syncer(tracker, backend(ipt))
    syncer.sync()
    # Someone deletes service a's KUBE-SERVICES rules: the partial sync's -D of them fails.
    nat = ipt.tables["nat"]
    nat["KUBE-SERVICES"] = [r for r in nat["KUBE-SERVICES"] if "ns/a:http" not in r]
    a = [o for o in START if o["metadata"]["name"] == "a"]
    for o in a:
        tracker.apply(Event(o["kind"], EventType.DELETED, o))
    syncer.sync()
    assert syncer.stats.full_syncs == 2
    assert syncer.last_full_reason.startswith("a partial write failed: "), syncer.last_full_reason
    same(ipt.tables, kernel([o for o in START if o not in a]), "after the fallback")


def _appended(restore: str) -> dict[str, int]:
    """Rules a restore input adds (``-A`` and ``-I`` lines), per table."""
    counts = {"filter": 0, "nat": 0}
    table = ""
    for line in restore.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(("-A ", "-I ")):
            counts[table] += 1
    return counts


def test_the_rules_written_metric_counts_what_each_restore_adds() -> None:
    """kubeproxy_sync_proxy_rules_iptables_last is counted from the rules pyproxy rendered;
    it must equal what the restore it wrote adds, for a full sync and for each partial."""
    registry = CollectorRegistry()
    objs = {key(o): o for o in START}
    tracker = tracker_with("node-a", *START)
    ipt = FakeIptables()
    b = backend(ipt)
    b.register_metrics(registry)
    syncer = Syncer(tracker, b)

    def last(table: str) -> float | None:
        return registry.get_sample_value("kubeproxy_sync_proxy_rules_iptables_last",
                                         {"table": table, "ip_family": "IPv4"})  # fmt: skip

    for what, changed, deleted in [("full", [], []), *STEPS]:
        apply(tracker, objs, changed, deleted)
        before = len(ipt.restores)
        syncer.sync()
        written = _appended(ipt.restores[before])  # the jumps into the chains come after
        assert (last("filter"), last("nat")) == (written["filter"], written["nat"]), what


def test_service_traffic_counts_chains_for_the_port_they_were_rendered_for() -> None:
    """Above 1,000 endpoints upstream's rules carry no comments, so the kernel's listing does
    not say which service an endpoint chain serves; the rendered rules do."""
    ips = [f"10.2.{i // 250}.{i % 250 + 1}" for i in range(1001)]
    objs = [svc("big", "10.96.1.1"), eps("big", ips), *START[1:3]]
    ipt = FakeIptables()
    b = backend(ipt)
    Syncer(tracker_with("node-a", *objs), b).sync()
    nat = ipt.tables["nat"]
    assert not any("--comment" in r for c, rules in nat.items() if c.startswith("KUBE-SEP-")
                   for r in rules)  # fmt: skip
    big = [c for c in nat if c.startswith("KUBE-SEP-") and "10.2.0.1:8080" in nat[c][1]]
    small = [c for c in nat if c.startswith("KUBE-SEP-") and "10.1.0.1:8080" in nat[c][1]]
    assert len(big) == 1 and len(small) == 1
    ipt.counters[("nat", big[0], 1)] = (4, 240)  # the DNAT rule, after the hairpin MARK
    ipt.counters[("nat", big[0], 0)] = (9, 999)  # the hairpin rule: not a connection count
    ipt.counters[("nat", small[0], 1)] = (2, 120)
    traffic = b.service_traffic()
    assert traffic["ns/big:http"] == ServiceTraffic(4, 4, 240)
    assert traffic["ns/a:http"] == ServiceTraffic(2, 2, 120)
