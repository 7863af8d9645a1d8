"""Fixtures for the namespace tests: one world and one pyproxy per module.

Each test writes its own manifest file (own service IPs), waits for its rules, probes with
real packets and removes the file. Skipped, with the reason, where namespaces are unavailable.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns.world import PYPROXY, Pyproxy, SocketCgroup, World, can_run

REASON = can_run()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/netns" in str(item.fspath) and REASON:
            item.add_marker(pytest.mark.skip(reason=REASON))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module listing PYPROXY_MODES runs its tests once per mode, one pyproxy at a time."""
    modes = getattr(metafunc.module, "PYPROXY_MODES", None)
    if modes and "proxy" in metafunc.fixturenames:
        metafunc.parametrize("proxy", modes, indirect=True, scope="module")


@pytest.fixture(scope="module")
def scratch_ns() -> Iterator[str]:
    """An empty network namespace of the module's own, for running a tool against this
    kernel (removed afterwards, also when a test failed)."""
    name = f"pyk-scratch-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    tag = f"{os.getpid() % 10000}{abs(hash(request.module.__name__)) % 100}"
    w = World(tag).build(pod_count=4, client_count=2)
    try:
        yield w
    finally:
        w.close()


@pytest.fixture(scope="module")
def proxy(
    world: World, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Pyproxy]:
    d = tmp_path_factory.mktemp("manifests")
    extra = list(getattr(request.module, "PYPROXY_FLAGS", ()))
    mode = getattr(request, "param", getattr(request.module, "PYPROXY_MODE", "iptables"))
    if mode == "ebpf":
        world.sockets = SocketCgroup(tmp_path_factory.mktemp("ebpf"))
        extra += world.sockets.flags()
    p = Pyproxy(world, d, d.parent / f"{d.name}-pyproxy.log", *extra, mode=mode)
    try:
        yield p.start()
    finally:
        p.stop()
        if hasattr(request, "param") or world.sockets:  # the next mode starts from a clean node
            flags = world.sockets.flags() if world.sockets else []
            world.exec(world.node, PYPROXY, "cleanup", f"--mode={mode}", *flags, check=False)
            world.exec(world.node, "conntrack", "-F", check=False)
        if world.sockets is not None:
            world.sockets.close()
            world.sockets = None
        log = Path(p.log)
        if log.exists():
            print(
                f"--- pyproxy log ({log}) tail ---\n"
                + "\n".join(log.read_text().splitlines()[-40:])
            )
