"""Boots user-mode Linux and runs the IPVS tests (tests/ipvs_guest) on its real IPVS."""

from __future__ import annotations

import pytest

from tests.uml.harness import run, unavailable

REASON = unavailable()


@pytest.mark.skipif(REASON is not None, reason=str(REASON))
@pytest.mark.timeout(900)  # the guest's own run is bounded at 900 s: boot, then its tests
def test_ipvs_mode_in_user_mode_linux() -> None:
    res = run("python -m pytest -q -rs -p no:cacheprovider tests/ipvs_guest", timeout=900)
    print(res.output)
    assert res.rc == 0, (
        f"guest tests failed (rc={res.rc}):\n{res.output[-6000:]}\nconsole:\n{res.console[-2000:]}"
    )
    assert " passed" in res.output and " skipped" not in res.output
