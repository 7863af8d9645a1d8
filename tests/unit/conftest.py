"""The unit suite never changes the machine it runs on: the sysctls a mode sets at start are
read before and after the session, and must be as they were (a backend built without its
sysctl port once set route_localnet on the host)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

WATCHED = ("net/ipv4/conf/all/route_localnet", "net/ipv4/ip_forward",
           "net/ipv4/conf/all/arp_ignore", "net/ipv4/conf/all/arp_announce")  # fmt: skip


def _read() -> dict[str, str]:
    out = {}
    for name in WATCHED:
        path = Path("/proc/sys") / name
        out[name] = path.read_text().strip() if path.exists() else ""
    return out


@pytest.fixture(autouse=True, scope="session")
def host_sysctls_unchanged() -> Iterator[None]:
    before = _read()
    yield
    assert _read() == before, "a unit test changed this host's sysctls"
