"""The node's conntrack settings at start, as kube-proxy writes them (its platformSetup):
the TCP timeouts are the node namespace's own, so pyproxy sets them there (upstream's e2e
"KubeProxy should set TCP CLOSE_WAIT timeout" reads 3600 from a host-network pod) and the
machine's stay as they were; the table's size only the machine's first namespace may write,
so a start asked to size it from a node namespace ends at once with one line, as upstream's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.netns.world import PYPROXY, Pyproxy, World, sh, wait_for

pytestmark = pytest.mark.netns
CLOSE_WAIT = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
ESTABLISHED = "net/netfilter/nf_conntrack_tcp_timeout_established"


def _read(world: World, name: str) -> int:
    return int(world.exec(world.node, "cat", f"/proc/sys/{name}").stdout)


def test_the_tcp_timeouts_are_set_in_the_node_namespace_only(world: World, proxy: Pyproxy) -> None:
    machine = {n: Path(f"/proc/sys/{n}").read_text() for n in (CLOSE_WAIT, ESTABLISHED)}
    wait_for(lambda: proxy.syncs() > 0, what="a first sync")
    assert (_read(world, CLOSE_WAIT), _read(world, ESTABLISHED)) == (3600, 86400)
    assert {n: Path(f"/proc/sys/{n}").read_text() for n in machine} == machine


def _start(ns: str, manifests: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, PYPROXY, "--manifests", str(manifests),
         "--hostname-override", "n", "--metrics-bind-address", "", "--healthz-bind-address", "",
         *flags],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _errors(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("pyproxy: error:")]


def test_sizing_the_table_from_a_node_namespace_ends_the_start(tmp_path: Path) -> None:
    """1 per CPU is below the minimum, so the size is the minimum, 131072, on any machine."""
    ns = f"ppk-cs{os.getpid() % 10000}"
    sh("ip", "netns", "add", ns)
    try:
        res = _start(ns, tmp_path, "--mode=iptables", "--conntrack-max-per-core=1",
                     "--conntrack-min=131072")  # fmt: skip
        close_wait = int(sh("ip", "netns", "exec", ns, "cat", f"/proc/sys/{CLOSE_WAIT}").stdout)
    finally:
        sh("ip", "netns", "del", ns, check=False)
    assert res.returncode == 1, res
    assert _errors(res) == [
        "pyproxy: error: could not set conntrack parameters: "
        "cannot set sysctl net.netfilter.nf_conntrack_max=131072: Permission denied"
    ]
    assert close_wait == 60  # nothing after the refused size was written


@pytest.mark.skipif(Path("/proc/net/ip_vs").exists(), reason="needs a mode that ends at start")
def test_zero_leaves_a_timeout_to_the_node(tmp_path: Path) -> None:
    """The settings are written before the mode prepares (upstream's platformSetup comes
    before its proxier): a start that IPVS mode ends on this kernel has set the established
    timeout and, at 0, left CLOSE_WAIT at the kernel's 60 s."""
    ns = f"ppk-cz{os.getpid() % 10000}"
    sh("ip", "netns", "add", ns)
    try:
        res = _start(ns, tmp_path, "--mode=ipvs", "--conntrack-max-per-core=0",
                     "--conntrack-tcp-timeout-close-wait=0")  # fmt: skip
        values = [
            int(sh("ip", "netns", "exec", ns, "cat", f"/proc/sys/{n}").stdout)
            for n in (CLOSE_WAIT, ESTABLISHED)
        ]
    finally:
        sh("ip", "netns", "del", ns, check=False)
    assert res.returncode == 1 and _errors(res)[0].startswith("pyproxy: error: IPVS"), res
    assert values == [60, 86400]
