"""The CI guard against skipped suites fails a run that skipped a test, and only then."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest

def test_runs():
    pass

@pytest.mark.skip(reason="no namespaces here")
def test_skipped():
    pass
"""


def test_a_skipped_test_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setenv("PYPROXY_NO_SKIPS", "1")
    res = pytester.runpytest("-p", "tests.no_skips")
    res.assert_outcomes(passed=1, skipped=1)
    assert res.ret == 1
    res.stdout.fnmatch_lines(["*PYPROXY_NO_SKIPS: test_suite.py::test_skipped was skipped*"])


def test_without_the_variable_a_skip_is_allowed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.delenv("PYPROXY_NO_SKIPS", raising=False)
    assert pytester.runpytest("-p", "tests.no_skips").ret == 0


def test_a_run_without_skips_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite="def test_runs():\n    pass\n")
    monkeypatch.setenv("PYPROXY_NO_SKIPS", "1")
    assert pytester.runpytest("-p", "tests.no_skips").ret == 0


def test_a_test_this_host_cannot_run_is_listed_not_failed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_suite="import pytest\nfrom tests.no_skips import HOST_CANNOT\n\n"
        "def test_guest():\n    pytest.skip(HOST_CANNOT + 'its CPU')\n"
    )
    monkeypatch.setenv("PYPROXY_NO_SKIPS", "1")
    res = pytester.runpytest("-p", "tests.no_skips")
    assert res.ret == 0
    res.stdout.fnmatch_lines(
        ["*PYPROXY_NO_SKIPS: NOT RUN on this host: test_suite.py::test_guest: "
         "this host cannot run it: its CPU*"]
    )  # fmt: skip
