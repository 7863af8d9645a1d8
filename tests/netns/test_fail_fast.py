"""A mode that cannot work on this host ends the process at start with one line and status
1, instead of retrying a sync that no retry can fix (upstream exits too)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.netns.world import PYPROXY, sh

pytestmark = pytest.mark.netns


@pytest.mark.skipif(
    Path("/proc/net/ip_vs").exists(), reason="this kernel has IPVS: nothing to refuse"
)
def test_ipvs_mode_without_ipvs_in_the_kernel_exits_at_once(tmp_path: Path) -> None:
    ns = f"ppk-ff{os.getpid() % 10000}"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        t0 = time.monotonic()
        res = subprocess.run(
            ["ip", "netns", "exec", ns, PYPROXY, "--mode=ipvs", "--manifests", str(tmp_path),
             "--hostname-override", "n", "--metrics-bind-address", "", "--conntrack-max-per-core=0",
             "--healthz-bind-address", ""],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        took = time.monotonic() - t0
    finally:
        sh("ip", "netns", "del", ns, check=False)
    assert res.returncode == 1, res
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("pyproxy: error:")]
    assert errors == ["pyproxy: error: IPVS is not available in this kernel: "
                      "(2, 'No such file or directory')"], res.stderr  # fmt: skip
    assert "retrying" not in res.stderr and took < 30


def test_ebpf_mode_without_a_cgroup_v2_directory_exits_at_once(tmp_path: Path) -> None:
    """A --bpf-cgroup that is not a cgroup v2 directory: nothing is attached, one line."""
    ns = f"ppk-fe{os.getpid() % 10000}"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        res = subprocess.run(
            ["ip", "netns", "exec", ns, PYPROXY, "--mode=ebpf", "--manifests", str(tmp_path),
             "--hostname-override", "n", "--metrics-bind-address", "", "--conntrack-max-per-core=0",
             "--healthz-bind-address", "", "--bpf-cgroup", str(tmp_path),
             "--bpf-pin-dir", str(tmp_path / "pins")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        sh("ip", "netns", "del", ns, check=False)
    assert res.returncode == 1, res
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("pyproxy: error:")]
    assert errors == [f"pyproxy: error: --mode=ebpf: --bpf-cgroup {tmp_path} is not a cgroup v2 "
                      "directory"], res.stderr  # fmt: skip
    assert not (tmp_path / "pins").exists()
