"""Faults pyproxy must survive without losing a connection, in the namespace world: another
program holding the xtables lock for 20 s, the restore tool killed in the middle of a
transaction, and 10,000 malformed objects beside 100 good services. Each test starts its own
pyproxy (iptables mode) and removes its rules after."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.bad_objects import generate
from tests.netns.scrape import get, metric, scrape
from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    HERE,
    PYPROXY,
    PYTHON,
    Pyproxy,
    SyncCounts,
    World,
    manifest_objects,
    total,
    wait_for,
)

pytestmark = pytest.mark.netns
HOLD_SECONDS = 20


@pytest.fixture()
def manifests(tmp_path: Path) -> Path:
    d = tmp_path / "manifests"
    d.mkdir()
    return d


@pytest.fixture()
def cleanup(world: World) -> Iterator[list[Pyproxy]]:
    started: list[Pyproxy] = []
    yield started
    for p in started:
        p.stop()
        tail = "\n".join(p.log.read_text().splitlines()[-30:]) if p.log.exists() else ""
        print(f"--- pyproxy log tail ---\n{tail}")
    world.exec(world.node, PYPROXY, "cleanup", "--mode=iptables", check=False)


def steady_client(world: World, ip: str, count: int, interval: float) -> subprocess.Popen[str]:
    """Connections to ``ip``:80 at a fixed pace; ends by itself after ``count``."""
    return world.spawn(
        world.client(0), PYTHON, str(HERE / "probe.py"), "tcp", ip, "80",
        "--count", str(count), "--interval", str(interval), "--timeout", "2",
    )  # fmt: skip


def lost(client: subprocess.Popen[str], count: int) -> dict[str, object]:
    out, _ = client.communicate(timeout=count * 2.5 + 60)
    result = json.loads(out)
    assert total(result) + sum(result["errors"].values()) == count, result
    return dict(result["errors"])


def test_xtables_lock_held_for_20s(
    world: World, manifests: Path, tmp_path: Path, cleanup: list[Pyproxy]
) -> None:
    """The legacy back end serializes on /run/xtables.lock. pyproxy runs in a private mount
    namespace whose /run/xtables.lock is a file of this test's own (the machine's lock is never
    touched); the test holds that lock for 20 s while a new service is added."""
    lock = tmp_path / "xtables.lock"
    lock.touch()
    proxy = Pyproxy(world, manifests, tmp_path / "pyproxy.log", "--iptables-backend", "legacy",
                    "--metrics-bind-address", "127.0.0.1:10249")  # fmt: skip
    proxy.prefix = (
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount --bind "$0" /run/xtables.lock && exec "$@"', str(lock),
    )  # fmt: skip
    cleanup.append(proxy.start())
    proxy.write("a", *manifest_objects(world, svc("a", "10.96.40.1", [HTTP]), pods(world, 1),
                                       HTTP_EP))  # fmt: skip
    reachable(world, "10.96.40.1", timeout=30)
    count, interval = int(HOLD_SECONDS / 0.1), 0.1
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        taken = time.monotonic()
        client = steady_client(world, "10.96.40.1", count, interval)
        failures = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
        before = metric(scrape(world), failures, '{ip_family="IPv4"}')
        proxy.write("b", *manifest_objects(world, svc("b", "10.96.40.2", [HTTP]), pods(world, 2),
                                           HTTP_EP))  # fmt: skip
        wait_for(lambda: metric(scrape(world), failures, '{ip_family="IPv4"}') > before,
                 timeout=15, what="a restore failing on the held lock")  # fmt: skip
        assert "holding the xtables lock" in proxy.log.read_text()  # the reason is logged
        time.sleep(max(0.0, taken + HOLD_SECONDS - 1.5 - time.monotonic()))  # the lock held
        # Still held: the new service cannot have been programmed.
        assert world.probe("tcp", "10.96.40.2", 80, timeout=1)["replies"] == {}
        time.sleep(max(0.0, taken + HOLD_SECONDS - time.monotonic()))
        fcntl.flock(held, fcntl.LOCK_UN)
    released = time.monotonic()
    # The retries show in the metrics (and /healthz stays 200: nothing waited 2 sync periods).
    m = scrape(world)
    assert metric(m, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                  '{ip_family="IPv4"}') >= 1  # fmt: skip
    assert metric(m, "pyproxy_sync_failures_total") >= 1
    reachable(world, "10.96.40.2", timeout=30)
    print(f"new service answered {time.monotonic() - released:.1f}s after the lock was freed")
    assert lost(client, count) == {}
    assert proxy.proc is not None and proxy.proc.poll() is None


def test_restore_killed_mid_transaction(
    world: World, manifests: Path, tmp_path: Path, cleanup: list[Pyproxy]
) -> None:
    """iptables-nft-restore is SIGKILLed with half a transaction read: nothing of it lands, the
    established service keeps answering, and the next sync is a full one that programs the
    change."""
    wrappers = tmp_path / "bin"
    wrappers.mkdir()
    for name in ("iptables-nft-restore", "ip6tables-nft-restore"):
        (wrappers / name).symlink_to(HERE / "killed_restore.py")
    trigger = tmp_path / "kill-next-restore"
    proxy = Pyproxy(world, manifests, tmp_path / "pyproxy.log", "--iptables-backend", "nft",
                    "--metrics-bind-address", "127.0.0.1:10249")  # fmt: skip
    proxy.env = {
        **os.environ,
        "PATH": f"{wrappers}:{os.environ['PATH']}",
        "PYPROXY_TEST_KILL_RESTORE": str(trigger),
    }
    cleanup.append(proxy.start())
    proxy.write("c", *manifest_objects(world, svc("c", "10.96.41.1", [HTTP]), pods(world, 1),
                                       HTTP_EP))  # fmt: skip
    reachable(world, "10.96.41.1", timeout=30)
    # The start's full sync must be over (its IPv6 transactions may still run after the IPv4
    # rules answer): the restore killed below is then the next change's own.
    first = proxy.wait_programmed(SyncCounts(), timeout=30, what="the first sync")
    count, interval = 100, 0.05
    client = steady_client(world, "10.96.41.1", count, interval)
    trigger.touch()
    proxy.write("d", *manifest_objects(world, svc("d", "10.96.41.2", [HTTP]), pods(world, 2),
                                       HTTP_EP))  # fmt: skip
    wait_for(lambda: Path(f"{trigger}.done").exists(), timeout=15, what="the killed restore")
    reachable(world, "10.96.41.2", timeout=30)
    # The failed partial write is followed, in the same sync, by a full one, which says why.
    after = proxy.wait_syncs(first, full=True, what="a full sync after the failed write")
    assert after.last_full_reason.startswith("a partial write failed: ")
    assert after.last_full_reason.endswith("iptables-nft-restore failed: killed by signal 9")
    assert "iptables-nft-restore failed: killed by signal 9" in proxy.log.read_text()
    # /debug/rules keeps the failed transaction with its error beside the last applied ones.
    rules = json.loads(get(world, "http://127.0.0.1:10249/debug/rules")["body"])
    failed = rules["lastFailed"]
    assert failed["error"] == "iptables-nft-restore failed: killed by signal 9"
    assert failed["what"] in ("IPv4 nft iptables-restore", "IPv6 nft iptables-restore")
    assert all(t["at"] > failed["at"] for t in rules["lastApplied"] if t["what"] == failed["what"])
    assert lost(client, count) == {}
    assert proxy.proc is not None and proxy.proc.poll() is None


CONNECT_EACH = r"""
import json, socket, sys
failed = []
for ip in sys.argv[1:]:
    try:
        with socket.create_connection((ip, 80), timeout=2) as s:
            s.settimeout(2)
            if not s.recv(64):
                failed.append(ip)
    except OSError:
        failed.append(ip)
print(json.dumps(failed))
"""


def test_10000_malformed_objects_beside_100_good(
    world: World, manifests: Path, tmp_path: Path, cleanup: list[Pyproxy]
) -> None:
    """Objects bad by construction (tests/bad_objects.py, drawn by hypothesis) in the same
    manifests as 100 good services: the daemon stays up, every good service answers, and every
    bad object gives exactly one log line naming it and one count in pyproxy_skipped_objects."""
    bad = generate(10_000)
    for part in range(10):
        (manifests / f"junk-{part}.yaml").write_text(
            yaml.safe_dump_all(bad[part * 1000 : (part + 1) * 1000])
        )
    good_ips = [f"10.96.50.{i}" for i in range(1, 101)]
    docs = [d for i, ip in enumerate(good_ips)
            for d in manifest_objects(world, svc(f"good-{i}", ip, [HTTP]), pods(world, 1, 2),
                                      HTTP_EP)]  # fmt: skip
    (manifests / "good.yaml").write_text(yaml.safe_dump_all(docs))
    proxy = Pyproxy(world, manifests, tmp_path / "pyproxy.log",
                    "--metrics-bind-address", "127.0.0.1:10249")  # fmt: skip
    cleanup.append(proxy.start())
    proxy.wait_programmed(SyncCounts(), timeout=120, what="the first sync")
    failed = json.loads(
        world.exec(world.client(0), PYTHON, "-c", CONNECT_EACH, *good_ips, timeout=300).stdout
    )
    assert failed == []
    expected = {("Service", f"junk/{o['metadata']['name']}") if o["kind"] == "Service"
                else ("EndpointSlice", f"junk/{o['metadata']['name']}") for o in bad}  # fmt: skip
    lines = re.findall(r"skipping (Service|EndpointSlice) (junk/bad-[0-9-]+):",
                       proxy.log.read_text())  # fmt: skip
    assert len(lines) == len(bad) and set(lines) == expected
    m = scrape(world)
    assert metric(m, "pyproxy_skipped_objects", '{kind="Service"}') + metric(
        m, "pyproxy_skipped_objects", '{kind="EndpointSlice"}'
    ) == len(bad)
    assert proxy.proc is not None and proxy.proc.poll() is None


@pytest.mark.parametrize("backend", ["nft", "legacy"])
def test_one_deleted_rule_is_put_back(
    world: World, manifests: Path, tmp_path: Path, cleanup: list[Pyproxy], backend: str
) -> None:
    """Another program deletes one of pyproxy's rules (the canary stays): the drift check on
    the canary's timer sees it and a full sync puts it back. Periodic syncs are partial and
    write nothing, so they cannot be what repairs it."""
    period = 3
    proxy = Pyproxy(world, manifests, tmp_path / "pyproxy.log", "--iptables-backend", backend,
                    "--sync-period", f"{period}s")  # fmt: skip
    cleanup.append(proxy.start())
    proxy.write("e", *manifest_objects(world, svc("e", "10.96.42.1", [HTTP]), pods(world, 1, 2),
                                       HTTP_EP))  # fmt: skip
    reachable(world, "10.96.42.1", timeout=30)
    # The drift check takes its baseline once pyproxy has not written for a sync period.
    wait_for(lambda: proxy.state().get("backend", {}).get("driftCheck", {}).get("IPv4") == "armed",
             timeout=4 * period, what="the drift check's baseline")  # fmt: skip
    save = world.iptables_save("nat", backend)
    svc_chain = next(
        ln.split()[-1] for ln in save.splitlines()
        if ln.startswith("-A KUBE-SERVICES ") and " -d 10.96.42.1/32 " in ln
    )  # fmt: skip
    victim = next(ln for ln in save.splitlines()
                  if ln.startswith(f"-A {svc_chain} ") and "--probability" in ln)  # fmt: skip
    before = proxy.counts()
    world.exec(world.node, f"iptables-{backend}", "-t", "nat", "-D", *shlex.split(victim)[1:])
    assert victim not in world.iptables_save("nat", backend).splitlines()
    wait_for(lambda: victim in world.iptables_save("nat", backend).splitlines(),
             timeout=3 * period, what="the deleted rule to be put back")  # fmt: skip
    repaired = proxy.wait_syncs(before, full=True, timeout=10, what="the full sync")
    assert repaired.last_full_reason == "rules changed by another program"
    said = "a rule of pyproxy's was changed or deleted (the canary is still there)"
    assert said in proxy.log.read_text()
    r = world.probe("tcp", "10.96.42.1", 80, count=40)
    assert set(r["replies"]) == {"pod-1", "pod-2"}
