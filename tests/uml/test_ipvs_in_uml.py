"""Boots user-mode Linux and runs the IPVS tests (tests/ipvs_guest) on its real IPVS."""

from __future__ import annotations

import pytest

from tests.no_skips import HOST_CANNOT
from tests.uml.harness import run, unavailable

REASON = unavailable()
FP_REFUSED = "ptrace set fp regs failed"
FP_TOO_SMALL = (
    "user-mode Linux 6.1 ends before booting: ptrace set fp regs failed (the host's XSAVE "
    "state, e.g. with AMX tile data, is larger than UML 6.1's FP buffer)"
)


@pytest.mark.skipif(REASON is not None, reason=str(REASON))
@pytest.mark.timeout(900)  # the guest's own run is bounded at 900 s: boot, then its tests
def test_ipvs_mode_in_user_mode_linux() -> None:
    res = run("python -m pytest -q -rs -p no:cacheprovider tests/ipvs_guest", timeout=900)
    print(res.output)
    if res.rc == -1 and FP_REFUSED in res.console:
        pytest.skip(HOST_CANNOT + FP_TOO_SMALL)
    assert res.rc == 0, (
        f"guest tests failed (rc={res.rc}):\n{res.output[-6000:]}\nconsole:\n{res.console[-2000:]}"
    )
    assert " passed" in res.output and " skipped" not in res.output
