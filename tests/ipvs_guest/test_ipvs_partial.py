"""IPVS partial syncs on the kernel's real IPVS (inside the user-mode Linux guest): with a long
sync period, the namespace suite's 20 assorted changes are programmed by partial syncs alone,
and the kernel then holds exactly what a fresh full render of the same objects wants
(virtual and real servers, kube-ipvs0's addresses); a restart's full sync, which reads the
kernel and writes every difference, then finds nothing to change."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.netns.scenarios import changes
from tests.netns.world import CLUSTER_CIDR, PYPROXY, Pyproxy, SyncCounts, World

pytestmark = pytest.mark.skipif(
    os.environ.get("PYPROXY_IN_UML") != "1", reason="runs inside the user-mode Linux guest only"
)
Servers = dict[str, dict[str, int]]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World("q").build(pod_count=4, client_count=1)
    try:
        yield w
    finally:
        w.close()


@pytest.fixture(scope="module")
def proxy(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pyproxy]:
    d = tmp_path_factory.mktemp("partial")
    p = Pyproxy(world, d, d.parent / "pyproxy-ipvs-partial.log", "--sync-period", "1h",
                "--iptables-backend", "legacy", "--log-level", "debug",
                mode="ipvs").start()  # fmt: skip
    try:
        yield p
    finally:
        p.stop()
        world.exec(world.node, PYPROXY, "cleanup", "--mode=ipvs", check=False)
        print(p.log.read_text()[-8000:])


def parse_listing(text: str) -> Servers:
    """{"PROTO addr:port": {"addr:port": weight}} from ``ipvsadm -Ln`` or the render's listing."""
    out: Servers = {}
    current = ""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] in ("TCP", "UDP", "SCTP"):
            current = f"{fields[0]} {fields[1]}"
            out[current] = {}
        elif current and len(fields) >= 4 and fields[0] == "->" and fields[1][0] in "0123456789[":
            out[current][fields[1]] = int(fields[3])
    return out


def kernel(world: World) -> tuple[Servers, set[str]]:
    servers = parse_listing(world.exec(world.node, "ipvsadm", "-Ln").stdout)
    addrs = world.exec(world.node, "ip", "-o", "addr", "show", "kube-ipvs0").stdout
    return servers, set(re.findall(r"inet6? ([0-9a-f.:]+)/", addrs))


def fresh_render(proxy: Pyproxy) -> tuple[Servers, set[str]]:
    text = subprocess.run(
        [PYPROXY, "render", "--mode=ipvs", "--manifests", str(proxy.manifests),
         "--node", "node-a", "--cluster-cidr", CLUSTER_CIDR],
        capture_output=True, text=True, check=True,
    ).stdout.split("# IPv6")[0]  # fmt: skip
    addrs = re.search(r"^# kube-ipvs0 addresses: (.*)$", text, re.M)
    assert addrs is not None
    return parse_listing(text), set(addrs.group(1).split())


def port_of(key: str) -> int:
    return int(key.rsplit(":", 1)[1])


def without_node_ports(servers: Servers) -> Servers:
    return {k: v for k, v in servers.items() if port_of(k) < 30000}


def node_ports(servers: Servers) -> dict[tuple[str, int], dict[str, int]]:
    """{(protocol, node port): real servers}, the same on every node address."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    for key, dests in servers.items():
        if port_of(key) >= 30000:
            seen = out.setdefault((key.split()[0], port_of(key)), dests)
            assert seen == dests, key
    return out


def test_twenty_changes_need_no_full_sync(world: World, proxy: Pyproxy) -> None:
    now = proxy.wait_syncs(SyncCounts(), full=True, what="the first full sync", timeout=60)
    steps = changes(world)
    for name, content in steps:
        if content is None:
            proxy.remove(name)
        else:
            proxy.write(name, *content)
        try:
            now = proxy.wait_programmed(now, what=f"a sync of {name}", timeout=60)
        except AssertionError:
            assert proxy.proc is not None
            os.kill(proxy.proc.pid, signal.SIGQUIT)  # its threads' stacks, into its log
            time.sleep(1)  # diagnostics on the way out: time for the dump to be written
            raise
    assert now.full == 1
    got = kernel(world)
    want = fresh_render(proxy)
    # The render has no node addresses offline (the daemon asks the kernel), so it lists no
    # NodePort; those are checked against the cluster IPs' real servers: b's two ports (one
    # renumbered from 30401), and e's with externalTrafficPolicy Local and no local endpoint.
    assert without_node_ports(got[0]) == without_node_ports(want[0])
    assert node_ports(got[0]) == {
        ("TCP", 30411): got[0]["TCP 10.96.40.2:80"],
        ("UDP", 30402): got[0]["UDP 10.96.40.2:53"],
        ("TCP", 30405): {},
    }
    assert got[1] == want[1]
    assert "TCP 198.51.100.40:80" in got[0]  # a's external IP, added late
    assert not [k for k in got[0] if " 10.96.40.3:" in k or " 10.96.40.4:" in k]  # c, d gone

    # A restart's full sync compares the kernel with the whole state: nothing to change.
    proxy.stop()
    proxy.start()
    proxy.wait_syncs(SyncCounts(), full=True, what="the restart's full sync", timeout=60)
    assert kernel(world) == got
