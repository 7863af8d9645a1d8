"""The IPVS fake refuses what the kernel refuses: the list in ``tests/ipvs_refusals.py``,
which the user-mode Linux guest also runs against the kernel's real IPVS."""

from __future__ import annotations

import pytest

from pyproxy.kernel.ipvs_fake import FakeIpvsKernel
from tests.ipvs_refusals import CASES, Op, check


@pytest.mark.parametrize(("what", "op", "refused"), CASES, ids=[c[0] for c in CASES])
def test_the_fake_refuses_what_ipvs_refuses(what: str, op: Op, refused: bool) -> None:
    k = FakeIpvsKernel()
    check(k.ipvs(), k.ipsets(), op, refused)
