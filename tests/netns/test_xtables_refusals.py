"""iptables-nft-restore and iptables-legacy-restore in a namespace refuse exactly the
transactions of ``tests/xtables_refusals.py`` that the unit suite's checking fake
(``pyproxy.kernel.iptables_fake``) refuses, and a refused one changes nothing."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.xtables_refusals import CASES, SETUP


def run(
    ns: str, tool: str, *args: str, text: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, tool, *args], input=text, text=True,
                          capture_output=True, timeout=30)  # fmt: skip


@pytest.fixture(scope="module")
def ns() -> Iterator[str]:
    name = f"pyk-iptref-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize(("what", "text", "refused"), CASES, ids=[c[0] for c in CASES])
def test_iptables_refuses_what_the_fake_refuses(
    ns: str, backend: str, what: str, text: str, refused: bool
) -> None:
    tool = f"iptables-{backend}"
    for flag in ("-F", "-X"):
        assert run(ns, tool, "-t", "nat", flag).returncode == 0
    setup = run(ns, f"{tool}-restore", "--noflush", text=SETUP)
    assert setup.returncode == 0, setup.stderr
    before = run(ns, f"{tool}-save", "-t", "nat").stdout
    res = run(ns, f"{tool}-restore", "--noflush", text=text)
    assert (res.returncode != 0) == refused, f"{what}: rc={res.returncode} {res.stderr}"
    if refused:
        after = run(ns, f"{tool}-save", "-t", "nat").stdout
        strip = [ln for ln in before.splitlines() if not ln.startswith("#")]
        assert [ln for ln in after.splitlines() if not ln.startswith("#")] == strip
