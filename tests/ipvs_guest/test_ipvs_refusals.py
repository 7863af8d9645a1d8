"""The kernel's real IPVS and ipsets (inside the user-mode Linux guest, whose kernel is its
own) held to the refusal list the unit suite holds the IPVS fake to (``tests/ipvs_refusals.py``):
each case after a fresh set-up, everything it made removed afterwards."""

from __future__ import annotations

import os

import pytest

from pyproxy.kernel.ipvs import IpvsKernel
from tests.ipvs_refusals import CASES, Op, check, teardown

pytestmark = pytest.mark.skipif(
    os.environ.get("PYPROXY_IN_UML") != "1", reason="runs inside the user-mode Linux guest only"
)


@pytest.mark.parametrize(("what", "op", "refused"), CASES, ids=[c[0] for c in CASES])
def test_ipvs_refuses_what_the_fake_refuses(what: str, op: Op, refused: bool) -> None:
    kernel = IpvsKernel()
    ipvs, sets = kernel.ipvs(), kernel.ipsets()
    try:
        teardown(ipvs, sets)  # nothing left from a case before
        check(ipvs, sets, op, refused)
    finally:
        teardown(ipvs, sets)
        ipvs.close()
        sets.close()
