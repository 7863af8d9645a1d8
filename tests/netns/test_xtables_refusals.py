"""iptables-nft-restore and iptables-legacy-restore in a namespace refuse exactly the
transactions of ``tests/xtables_refusals.py`` that the unit suite's checking fake
(``pyproxy.kernel.iptables_fake``) refuses, and a refused one changes nothing."""

from __future__ import annotations

import pytest

from tests.netns.world import in_ns
from tests.xtables_refusals import CASES, SETUP


def saved(ns: str, tool: str) -> list[str]:
    out = in_ns(ns, f"{tool}-save", "-t", "nat").stdout
    return [line for line in out.splitlines() if not line.startswith("#")]


@pytest.mark.parametrize("backend", ["nft", "legacy"])
@pytest.mark.parametrize(("what", "text", "refused"), CASES, ids=[c[0] for c in CASES])
def test_iptables_refuses_what_the_fake_refuses(
    scratch_ns: str, backend: str, what: str, text: str, refused: bool
) -> None:
    tool = f"iptables-{backend}"
    for flag in ("-F", "-X"):
        assert in_ns(scratch_ns, tool, "-t", "nat", flag).returncode == 0
    setup = in_ns(scratch_ns, f"{tool}-restore", "--noflush", text=SETUP)
    assert setup.returncode == 0, setup.stderr
    before = saved(scratch_ns, tool)
    res = in_ns(scratch_ns, f"{tool}-restore", "--noflush", text=text)
    assert (res.returncode != 0) == refused, f"{what}: rc={res.returncode} {res.stderr}"
    if refused:
        assert saved(scratch_ns, tool) == before
