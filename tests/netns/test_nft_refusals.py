"""This kernel refuses exactly the transactions of ``tests/nft_refusals.py`` that the unit
suite's checking fake (``pyproxy.kernel.nft_fake``) refuses, and a refused one changes
nothing: the fake's refusals are the kernel's, measured here, not assumed."""

from __future__ import annotations

import pytest

from tests.netns.world import in_ns
from tests.nft_refusals import CASES, SETUP


@pytest.mark.parametrize(("what", "text", "refused"), CASES, ids=[c[0] for c in CASES])
def test_the_kernel_refuses_what_the_fake_refuses(
    scratch_ns: str, what: str, text: str, refused: bool
) -> None:
    assert in_ns(scratch_ns, "nft", "flush", "ruleset").returncode == 0
    setup = in_ns(scratch_ns, "nft", "-f", "-", text=SETUP)
    assert setup.returncode == 0, setup.stderr
    before = in_ns(scratch_ns, "nft", "-s", "list", "ruleset").stdout
    res = in_ns(scratch_ns, "nft", "-f", "-", text=text)
    assert (res.returncode != 0) == refused, f"{what}: rc={res.returncode} {res.stderr}"
    if refused:
        assert in_ns(scratch_ns, "nft", "-s", "list", "ruleset").stdout == before
