"""A pytest plugin for CI: with PYPROXY_NO_SKIPS=1, a skipped test fails the run, so a suite
that silently stopped running (no namespaces, no control plane, no guest) cannot pass for one
that ran. The IPVS guest's tests are skipped on the host by design: they run inside user-mode
Linux (tests/uml), which reports them itself. A test whose skip reason starts with
``HOST_CANNOT`` found, by running, that this host cannot run it at all (user-mode Linux 6.1
on a CPU whose XSAVE state it cannot hold): it is listed as NOT RUN at the end, loudly, and
does not fail the run, which no change to the code could make pass."""

from __future__ import annotations

import os

import pytest

RUN_ELSEWHERE = ("tests/ipvs_guest/",)
HOST_CANNOT = "this host cannot run it: "


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class NoSkips:
    def __init__(self) -> None:
        self.skipped: list[str] = []
        self.not_run: list[str] = []

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not report.nodeid.startswith(RUN_ELSEWHERE):
            reason = _reason(report)
            if reason.startswith(HOST_CANNOT):
                self.not_run.append(f"{report.nodeid}: {reason}")
            else:
                self.skipped.append(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped and session.exitstatus == 0:
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for nodeid in self.skipped:
            terminalreporter.write_line(f"PYPROXY_NO_SKIPS: {nodeid} was skipped", red=True)
        for line in self.not_run:
            terminalreporter.write_line(f"PYPROXY_NO_SKIPS: NOT RUN on this host: {line}",
                                        yellow=True)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYPROXY_NO_SKIPS") == "1":
        config.pluginmanager.register(NoSkips(), "pyproxy-no-skips")
