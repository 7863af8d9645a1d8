"""Fixtures for the end-to-end tests: a real control plane (session), and per module a node
namespace world with pyproxy watching the API server through a relay.

Skipped with the reason when the control-plane binaries are not built (``make e2e`` builds
them first) or when namespaces cannot be made here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cluster import (
    ADMIN_TOKEN,
    Cluster,
    ExternalCluster,
    kubeconfig,
    missing_binaries,
)
from tests.cluster.nsrelay import Relay
from tests.e2e.kube import Kube
from tests.netns.world import Pyproxy, World, can_run

ROOT = Path(__file__).resolve().parents[2]
EXTERNAL = os.environ.get("PYPROXY_E2E_KUBECONFIG")
REASON = can_run() or (
    f"control-plane binaries not built ({', '.join(missing_binaries())}): run `make e2e`"
    if missing_binaries() and not EXTERNAL
    else None
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
            if REASON:
                item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if EXTERNAL:
        yield ExternalCluster(Path(EXTERNAL))  # an existing cluster: nothing is applied to it
        return
    c = Cluster(tmp_path_factory.mktemp("control-plane")).start()
    try:
        Kube(c).apply_files(
            ROOT / "deploy" / "base" / "serviceaccount.yaml", ROOT / "deploy" / "base" / "rbac.yaml"
        )
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def kube(cluster: Cluster) -> Kube:
    return Kube(cluster)


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    tag = f"e{os.getpid() % 1000}{abs(hash(request.module.__name__)) % 100}"
    w = World(tag).build(pod_count=4, client_count=1)
    try:
        yield w
    finally:
        w.close()


def require_local(cluster: Cluster) -> None:
    if isinstance(cluster, ExternalCluster):
        pytest.skip(
            "needs the local control plane (relays a proxy to it, stops it, compacts "
            "etcd, uses its static tokens); PYPROXY_E2E_KUBECONFIG points elsewhere"
        )


@pytest.fixture(scope="module")
def relay(world: World, cluster: Cluster) -> Iterator[Relay]:
    require_local(cluster)
    r = Relay(world.node, 6443, ("127.0.0.1", cluster.api_port))
    try:
        yield r
    finally:
        r.close()


def in_ns_kubeconfig(cluster: Cluster, token: str, path: Path, port: int = 6443) -> Path:
    path.write_text(kubeconfig(f"https://127.0.0.1:{port}", cluster.ca, token))
    return path


@pytest.fixture(scope="module")
def proxy(
    world: World,
    cluster: Cluster,
    relay: Relay,
    kube: Kube,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Pyproxy]:
    from tests.cluster.cluster import PYPROXY_TOKEN

    d = tmp_path_factory.mktemp("pyproxy")
    kube.node("node-a")
    cfg = in_ns_kubeconfig(cluster, PYPROXY_TOKEN, d / "kubeconfig")
    extra = getattr(request.module, "PYPROXY_FLAGS", ())
    p = Pyproxy(
        world,
        None,
        d / "pyproxy.log",
        "--metrics-bind-address",
        "127.0.0.1:10249",
        *extra,
        kubeconfig=cfg,
    ).start()
    try:
        yield p
    finally:
        p.stop()
        print(
            "--- pyproxy log tail ---\n" + "\n".join(p.log.read_text().splitlines()[-30:])
            if p.log.exists()
            else ""
        )


__all__ = ["ADMIN_TOKEN"]
