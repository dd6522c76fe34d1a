"""``ConformanceSession``: the pytest plugin object active during a conformance run.

Registered by ``slotwise.testing.pytest_plugin`` only when ``--slotwise-conformance``
is given.  It runs the checks in the suite's order (cheap, fundamental ones first,
so a broken interface shows before the failures it causes), records how each of
the suite's tests ended, optionally writes that as a JSON report, and puts
``SLOTWISE_PLATFORM`` back as it was when the session ends.

A check that applies to the platform but cannot run here (``target.not_run``: the
communicator with one visible device) is a skip to pytest, recorded as not run: the
terminal summary names it, and with ``--slotwise-require-all`` it fails the session.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

from slotwise.testing.conformance import CHECKS, check_of
from slotwise.testing.conformance.report import TestOutcome, not_run_verdict, write_report

#: Which phase's outcome is the test's: a skip in any phase skips it, unless one failed.
PHASE_PRECEDENCE = ("error", "failed", "skipped", "passed")
#: The user property marking a report whose skip was ``CheckNotRun``.
NOT_RUN_PROPERTY = "slotwise_conformance_not_run"


class CheckNotRun(pytest.skip.Exception):
    """Raised by ``target.not_run``: the check applies, but this machine cannot run it."""


class ConformanceSession:
    def __init__(
        self,
        platform: str,
        report_path: Path | None,
        previous_env: str | None,
        require_all: bool = False,
    ) -> None:
        self.platform = platform
        self.report_path = report_path
        self.previous_env = previous_env
        self.require_all = require_all
        self.outcomes: dict[str, TestOutcome] = {}
        self.checks: dict[str, str] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Order the suite's tests by check; other tests keep their place after them."""
        for item in items:
            check = check_of(item.path)
            if check is not None:
                self.checks[item.nodeid] = check
        items.sort(key=lambda item: _rank(self.checks.get(item.nodeid)))

    def pytest_collectstart(self, collector: pytest.Collector) -> None:
        check = check_of(collector.path)
        if check is not None:
            self.checks[collector.nodeid] = check

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A suite module that cannot be imported fails its check, with the reason."""
        check = self.checks.get(report.nodeid)
        if report.failed and check is not None:
            self.outcomes[report.nodeid] = TestOutcome(
                check, report.nodeid.rpartition("/")[2], "error", _message(report)
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.excinfo is not None and call.excinfo.errisinstance(CheckNotRun):
            report.user_properties.append((NOT_RUN_PROPERTY, True))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Merge the phases (setup, call, teardown) of one test: the worst phase counts."""
        check = self.checks.get(report.nodeid)
        if check is None:
            return
        outcome = _outcome(report)
        recorded = self.outcomes.setdefault(
            report.nodeid, TestOutcome(check, report.nodeid.partition("::")[2], "passed")
        )
        recorded.duration += report.duration
        if PHASE_PRECEDENCE.index(outcome) < PHASE_PRECEDENCE.index(recorded.outcome):
            recorded.outcome = outcome
            recorded.message = _message(report)
            recorded.not_run = outcome == "skipped" and (NOT_RUN_PROPERTY, True) in (
                report.user_properties
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Fail a session with checks not run under ``--slotwise-require-all``; write the
        report with the final exit status."""
        if self.require_all and self._not_run() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.report_path is not None:
            write_report(
                self.report_path,
                self.platform,
                int(session.exitstatus),
                list(self.outcomes.values()),
            )

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """The checks not run, by name and reason, where pytest shows only "N skipped"."""
        verdict = not_run_verdict(self._not_run())
        if verdict:
            required = " (--slotwise-require-all: the run fails)" if self.require_all else ""
            terminalreporter.write_line(f"slotwise conformance: {verdict}{required}", red=True)

    def _not_run(self) -> list[TestOutcome]:
        return [test for test in self.outcomes.values() if test.not_run]

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.previous_env is None:
            os.environ.pop("SLOTWISE_PLATFORM", None)
        else:
            os.environ["SLOTWISE_PLATFORM"] = self.previous_env


def _rank(check: str | None) -> int:
    return CHECKS.index(check) if check is not None else len(CHECKS)


def _outcome(report: pytest.TestReport) -> str:
    """The outcome of one phase: a failing setup or teardown is an error of the test."""
    if report.skipped:
        return "skipped"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return "passed"


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The one-paragraph reason a test did not pass, as the summary shows it."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, "Skipped: reason")
        not_run = f"{CheckNotRun.__module__}.{CheckNotRun.__qualname__}: "
        return str(longrepr[2]).removeprefix("Skipped: ").removeprefix(not_run)
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:  # "Failed: " is how pytest.fail's messages start
        return str(crash.message).removeprefix("Failed: ")
    return str(longrepr)
