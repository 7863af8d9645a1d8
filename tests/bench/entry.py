"""What every benchmark's ``main`` does first: a SIGTERM that unwinds through the clean-ups
(namespaces, clusters, cgroups) instead of killing the process, and the check that it can run
here at all (root, and the control plane and upstream kube-proxy built)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.cluster.cluster import Cluster, binary, missing_binaries

ROOT = Path(__file__).resolve().parents[2]


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through the clean-ups


def start() -> str | None:
    """Install the SIGTERM handler; why the benchmark cannot run here (None: it can)."""
    signal.signal(signal.SIGTERM, _exit_on_term)
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if missing_binaries() or binary("kube-proxy") is None:
        return "the control plane and kube-proxy are not built: run `make e2e` first"
    return None


@contextmanager
def cluster(
    prefix: str, node_ip: str, storage_json: bool = False
) -> Iterator[tuple[Cluster, Path]]:
    """A control plane in a new work directory, with pyproxy's service account and RBAC
    applied and a ready Node ``node-a`` at ``node_ip``; stopped and removed afterwards. No
    controller manager: the benchmarks write every EndpointSlice themselves
    (``Cluster.controller_manager``). ``storage_json``: see ``Cluster.storage_json``."""
    from tests.e2e.kube import Kube

    work = Path(tempfile.mkdtemp(prefix=prefix))
    c = Cluster(work / "control-plane", controller_manager=False, storage_json=storage_json)
    c.start()
    try:
        kube = Kube(c)
        kube.apply_files(
            ROOT / "deploy" / "base" / "serviceaccount.yaml", ROOT / "deploy" / "base" / "rbac.yaml"
        )
        kube.node("node-a")
        kube.patch_status("/api/v1/nodes/node-a", {"addresses": [
            {"type": "InternalIP", "address": node_ip},
            {"type": "Hostname", "address": "node-a"},
        ]})  # fmt: skip
        yield c, work
    finally:
        c.stop()
        shutil.rmtree(work, ignore_errors=True)
