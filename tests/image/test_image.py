"""The built image, run the way the DaemonSet runs it: host network of a node namespace,
NET_ADMIN/NET_RAW, the manifests directory mounted read-only; traffic must flow through the
rules the container programs. Run by ``make image-test`` after ``make image``."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns.world import NODE_CLIENT_IP, ROOT, World, can_run, names_in, total, wait_for

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
        "--manifests=/manifests",
        "--hostname-override=node-a",
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
