"""The real cluster's tests (kubelets, containerd, real pods): marked ``realcluster`` and run by
``make real-smoke``, not by ``make test``. Skipped with the reason when the binaries or images
are missing; CI runs with PYPROXY_NO_SKIPS=1, so a skip fails it there."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.cluster import host, real

# Dual-stack by default: every check of the smoke test runs in both families (IPv4 primary);
# PYPROXY_REAL_FAMILY=ipv4 or ipv6 brings up a single-family cluster instead.
FAMILY = os.environ.get("PYPROXY_REAL_FAMILY", "dual")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = None
    if os.geteuid() != 0:
        reason = "needs root"
    elif real.missing():
        reason = "not built (make real-smoke builds them): " + ", ".join(real.missing())
    for item in items:
        if "tests/realcluster" in str(item.fspath):
            item.add_marker(pytest.mark.realcluster)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    before = host.machine_facts()
    real.up("pyproxy", "iptables", FAMILY)
    try:
        yield before
    finally:
        real.down()
