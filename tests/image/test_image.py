"""The built image, run the way the DaemonSet runs it: host network of a node namespace,
the manifests directory mounted read-only; traffic must flow through the rules the container
programs. Each mode also runs confined (tests/image/confined.py: read-only root and /proc/sys,
not privileged) with exactly the capabilities the README lists for it, and fails at start with
one line when any one of them is missing. Run by ``make image-test`` after ``make image``."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.netns.world import (
    NODE_CLIENT_IP,
    PYPROXY,
    PYTHON,
    ROOT,
    SocketCgroup,
    World,
    can_run,
    names_in,
    total,
    wait_for,
)

IMAGE = os.environ.get("PYPROXY_IMAGE", "localhost/pyproxy:0.1.0")
STORE = ["--storage-driver", "vfs"]


def image_missing() -> str | None:
    if shutil.which("buildah") is None:
        return "buildah is not installed"
    res = subprocess.run(
        ["buildah", *STORE, "inspect", "--type", "image", IMAGE], capture_output=True
    )
    return None if res.returncode == 0 else f"image {IMAGE} not built: run `make image`"


pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(
        bool(can_run() or image_missing()), reason=str(can_run() or image_missing())
    ),
]


@pytest.fixture()
def container() -> Iterator[str]:
    ctr = subprocess.run(
        ["buildah", *STORE, "from", IMAGE], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield ctr
    finally:
        subprocess.run(["buildah", *STORE, "rm", ctr], capture_output=True)


def test_image_programs_a_node(container: str, tmp_path: Path) -> None:
    world = World(f"i{os.getpid() % 1000}").build(pod_count=3, client_count=1)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    shutil.copy(ROOT / "examples" / "services.yaml", manifests)
    log = (tmp_path / "container.log").open("w")
    proc = world.spawn(
        world.node,
        "buildah",
        *STORE,
        "run",
        "--isolation",
        "chroot",
        "--network",
        "host",
        "--cap-add",
        "CAP_NET_ADMIN",
        "--cap-add",
        "CAP_NET_RAW",
        "-v",
        f"{manifests}:/manifests:ro",
        container,
        "--",
        "pyproxy",
        "--mode=iptables",
        "--iptables-localhost-nodeports=false",  # as deploy/base/configmap.yaml: no sysctl to write
        "--manifests=/manifests",
        "--hostname-override=node-a",
        # As deploy/base/configmap.yaml: /proc/sys is read-only, the node's conntrack stays.
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--cluster-cidr=10.244.0.0/16",
        "--metrics-bind-address=",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: world.probe("tcp", "10.96.0.10", 80, timeout=1)["replies"],
            timeout=90,
            what="the containerised pyproxy to program the ClusterIP",
        )
        r = world.probe("tcp", NODE_CLIENT_IP, 30080, count=60)
        assert names_in(r) == {"pod-1", "pod-2", "pod-3"} and total(r) == 60
        # The container ran the image's own iptables, against the node namespace only.
        assert "KUBE-SVC-" in world.iptables_save("nat")
    finally:
        world.stop(proc)
        world.close()
        print((tmp_path / "container.log").read_text()[-2000:])


CONFINED = ROOT / "tests" / "image" / "confined.py"
CAP_BITS = {"NET_ADMIN": 12, "NET_RAW": 13, "BPF": 39}
# mode, the capabilities it needs (README "Least privilege"), its flags.
LEAST: list[tuple[str, list[str], list[str]]] = [
    ("nftables", ["NET_ADMIN"], ["--mode=nftables"]),
    ("iptables", ["NET_ADMIN"], ["--mode=iptables", "--iptables-backend=nft",
                                 "--iptables-localhost-nodeports=false"]),
    ("iptables-legacy", ["NET_ADMIN", "NET_RAW"], ["--mode=iptables",
     "--iptables-backend=legacy", "--iptables-localhost-nodeports=false"]),
    ("userspace", ["NET_ADMIN"], ["--mode=userspace"]),
    # The test's own cgroup and bpffs, bound in at /cgroup and /bpf (the DaemonSet's hostPaths
    # are the node's cgroup2 root and /sys/fs/bpf).
    ("ebpf", ["NET_ADMIN", "BPF"], ["--mode=ebpf", "--bpf-cgroup=/cgroup",
                                    "--bpf-pin-dir=/bpf/pyproxy"]),
]  # fmt: skip


@pytest.fixture()
def image_root(container: str) -> str:
    return subprocess.run(
        ["buildah", *STORE, "mount", container], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture()
def node_world(tmp_path: Path) -> Iterator[tuple[World, Path]]:
    world = World(f"c{os.getpid() % 1000}").build(pod_count=3, client_count=1)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    shutil.copy(ROOT / "examples" / "services.yaml", manifests)
    try:
        yield world, manifests
    finally:
        for mode in ("iptables", "nftables", "userspace"):
            world.exec(world.node, PYPROXY, "cleanup", f"--mode={mode}", check=False)
        if world.sockets is not None:  # ebpf mode's: unmounting its bpffs unpins everything
            world.sockets.close()
        world.close()


def confined(
    world: World, root: str, manifests: Path, caps: list[str], flags: list[str], log: Any
) -> subprocess.Popen[str]:
    lock = manifests.parent / "xtables.lock"  # the DaemonSet's hostPath /run/xtables.lock
    lock.touch()
    sockets = world.sockets  # ebpf mode: the test's cgroup and bpffs
    binds = [f"{sockets.path}:/cgroup", f"{sockets.bpffs}:/bpf"] if sockets else []
    return world.spawn(
        world.node, "unshare", "--mount", "--propagation", "private", PYTHON, str(CONFINED),
        root, *[a for c in caps for a in ("--cap", c)],
        *[a for b in binds for a in ("--bind", b)],
        "--bind", f"{manifests}:/manifests", "--bind", f"{lock}:/run/xtables.lock", "--",
        "/opt/pyproxy/bin/pyproxy", "--manifests=/manifests", "--hostname-override=node-a",
        "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--cluster-cidr=10.244.0.0/16", "--metrics-bind-address=", *flags,
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def effective_caps(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("CapEff:")[1].split()[0], 16)


@pytest.mark.parametrize(("mode", "caps", "flags"), LEAST, ids=[m for m, _, _ in LEAST])
def test_each_mode_runs_confined_with_exactly_its_capabilities(
    image_root: str, node_world: tuple[World, Path], tmp_path: Path,
    mode: str, caps: list[str], flags: list[str],
) -> None:  # fmt: skip
    world, manifests = node_world
    if mode == "ebpf":
        world.sockets = SocketCgroup(tmp_path)
    with (tmp_path / "confined.log").open("w") as log:
        proc = confined(world, image_root, manifests, caps, flags, log)
        try:
            wait_for(lambda: world.probe("tcp", "10.96.0.10", 80, timeout=1)["replies"],
                     timeout=60, what=f"confined pyproxy ({mode}) to answer")  # fmt: skip
            assert effective_caps(proc.pid) == sum(1 << CAP_BITS[c] for c in caps)
            r = world.probe("tcp", "10.96.0.10", 80, count=30)
            assert names_in(r) == {"pod-1", "pod-2", "pod-3"} and total(r) == 30
            r = world.probe("tcp", NODE_CLIENT_IP, 30080, count=30)
            assert names_in(r) == {"pod-1", "pod-2", "pod-3"} and total(r) == 30
            if world.sockets:  # a pod in the cgroup: balanced by the programs it loaded
                pod = world.ns_of(world.pods[0])
                r = world.probe("tcp", "10.96.0.10", 80, count=30, ns=pod, in_cgroup=True)
                assert names_in(r) == {"pod-1", "pod-2", "pod-3"} and total(r) == 30
                assert (world.sockets.pin_dir / "link_connect4").exists()
        finally:
            world.stop(proc)
            print((tmp_path / "confined.log").read_text()[-2000:])
    for missing in caps:  # each one is needed: without it the start ends with one line
        fewer = [c for c in caps if c != missing]
        with (tmp_path / f"without-{missing}.log").open("w") as log:
            proc = confined(world, image_root, manifests, fewer, flags, log)
            assert proc.wait(60) == 1
        last = (tmp_path / f"without-{missing}.log").read_text().splitlines()[-1]
        assert last.startswith("pyproxy: error: "), last


def test_localhost_nodeports_need_proc_sys_writable(
    image_root: str, node_world: tuple[World, Path], tmp_path: Path
) -> None:
    """iptables mode's default, NodePorts on 127.0.0.1, needs route_localnet=1: with /proc/sys
    read-only (not privileged) the start ends with one line naming the sysctl and the flag."""
    world, manifests = node_world
    with (tmp_path / "confined.log").open("w") as log:
        proc = confined(world, image_root, manifests, ["NET_ADMIN"], ["--mode=iptables"], log)
        assert proc.wait(60) == 1
    last = (tmp_path / "confined.log").read_text().splitlines()[-1]
    assert last == (
        "pyproxy: error: cannot set sysctl net.ipv4.conf.all.route_localnet=1: Read-only file "
        "system (needed by NodePorts on localhost; run privileged, or set it on the host first, "
        "or pass --iptables-localhost-nodeports=false)"
    )
