"""``ConformanceSession``: the pytest plugin object active during a conformance run.

Registered with ``--slotwise-conformance``: runs the checks in the suite's order
(fundamental ones first), each under a time limit, records how each test ended (a check
that cannot run here as not run), writes the JSON report as each test starts and ends,
and puts ``SLOTWISE_PLATFORM`` back at the end.  Every failure names the platform.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from slotwise.testing.conformance import CHECKS, check_of
from slotwise.testing.conformance.report import (
    RunningTest,
    TestOutcome,
    exceeded_message,
    not_run_verdict,
    write_report,
)
from slotwise.testing.conformance.time_limit import TimeLimit

#: Which phase's outcome is the test's: a skip in any phase skips it, unless one failed.
PHASE_PRECEDENCE = ("error", "failed", "skipped", "passed")
#: The user property marking a report whose skip was ``CheckNotRun``.
NOT_RUN_PROPERTY = "slotwise_conformance_not_run"


class CheckNotRun(pytest.skip.Exception):
    """Raised by ``target.not_run``: the check applies, but this machine cannot run it."""


#: The session of this process's conformance run, for ``target.calling``.
_active: ConformanceSession | None = None


@contextlib.contextmanager
def calling(what: str) -> Iterator[None]:
    """Name the platform call in progress (``"synchronize()"``) in the running test's
    record, so a process that ends or hangs inside it is reported with it."""
    session = _active
    if session is None or session.running is None:
        yield
        return
    session.note_call(what)
    try:
        yield
    finally:
        session.note_call("")


class ConformanceSession:
    def __init__(
        self,
        platform: str,
        report_path: Path | None,
        previous_env: str | None,
        require_all: bool = False,
        time_limit_s: float = 0,
        stderr_fd: int | None = None,
    ) -> None:
        """``stderr_fd``: a copy of pytest's stderr that its capture does not redirect,
        for the time limit's messages; the session closes it.  Needed for a limit > 0."""
        global _active
        self.platform = platform
        self.report_path = report_path
        self.previous_env = previous_env
        self.require_all = require_all
        self.outcomes: dict[str, TestOutcome] = {}
        self.checks: dict[str, str] = {}
        self.running: RunningTest | None = None
        self.selected: int | None = None
        self.stderr_fd = stderr_fd
        self.time_limit = TimeLimit(
            time_limit_s if stderr_fd is not None else 0,
            stderr_fd if stderr_fd is not None else 2,
            self._record_hang,
        )
        _active = self

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Order the suite's tests by check; other tests keep their place after them."""
        for item in items:
            check = check_of(item.path)
            if check is not None:
                self.checks[item.nodeid] = check
        items.sort(key=lambda item: _rank(self.checks.get(item.nodeid)))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = sum(1 for item in session.items if item.nodeid in self.checks)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        """Each of the suite's tests under the time limit, recorded as running meanwhile."""
        check = self.checks.get(item.nodeid)
        if check is None:
            return (yield)
        self.running = RunningTest(
            item.nodeid, check, _test_name(item.nodeid), time.time(), self.time_limit.limit_s
        )
        self._write_report(None)
        self.time_limit.start(self._exceeded)
        try:
            return (yield)
        finally:
            self.time_limit.stop()
            self.running = None

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        """An exception a check did not expect fails the test naming the platform, where
        it was raised, and with its traceback (the platform's code or the kit's)."""
        if pyfuncitem.nodeid not in self.checks:
            return (yield)
        try:
            return (yield)
        except Exception as exc:
            raise pytest.fail.Exception(
                f"platform {self.platform!r}: unexpected {type(exc).__name__}{_where(exc)}: {exc}",
                pytrace=True,
            ) from exc

    def note_call(self, what: str) -> None:
        if self.running is not None:
            self.running.calling = what
            self._write_report(None)

    def _exceeded(self) -> str:
        """The failure of a running test past the time limit."""
        running = self.running
        if running is None:
            return f"platform {self.platform!r}: a test exceeded the time limit"
        return exceeded_message(self.platform, running)

    def _record_hang(self, message: str) -> None:
        """Stage 2 of the time limit, before it ends the process: the running test failed."""
        running = self.running
        if running is not None:
            self.outcomes[running.nodeid] = TestOutcome(
                running.check, running.name, "failed", message, time.time() - running.started
            )
        self._write_report(int(pytest.ExitCode.TESTS_FAILED))

    def _write_report(self, exit_status: int | None) -> None:
        """The report as it stands; while the session runs (``exit_status`` None), without
        the running test's outcome, which is that of the phases it has finished so far."""
        if self.report_path is None:
            return
        running = self.running
        tests = [
            outcome
            for nodeid, outcome in self.outcomes.items()
            if exit_status is not None or running is None or nodeid != running.nodeid
        ]
        write_report(
            self.report_path,
            self.platform,
            exit_status,
            tests,
            running=running,
            selected=self.selected,
        )

    def pytest_collectstart(self, collector: pytest.Collector) -> None:
        check = check_of(collector.path)
        if check is not None:
            self.checks[collector.nodeid] = check

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A suite module that cannot be imported fails its check, with the reason."""
        check = self.checks.get(report.nodeid)
        if report.failed and check is not None:
            self.outcomes[report.nodeid] = TestOutcome(
                check, report.nodeid.rpartition("/")[2], "error", self._message(report)
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
            report.nodeid, TestOutcome(check, _test_name(report.nodeid), "passed")
        )
        recorded.duration += report.duration
        if PHASE_PRECEDENCE.index(outcome) < PHASE_PRECEDENCE.index(recorded.outcome):
            recorded.outcome = outcome
            recorded.message = self._message(report)
            recorded.not_run = outcome == "skipped" and (NOT_RUN_PROPERTY, True) in (
                report.user_properties
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Fail a session with checks not run under ``--slotwise-require-all``; write the
        report with the final exit status."""
        if self.require_all and self._not_run() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.running = None
        self._write_report(int(session.exitstatus))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """The checks not run, by name and reason, where pytest shows only "N skipped"."""
        verdict = not_run_verdict(self._not_run())
        if verdict:
            required = " (--slotwise-require-all: the run fails)" if self.require_all else ""
            terminalreporter.write_line(f"slotwise conformance: {verdict}{required}", red=True)

    def _not_run(self) -> list[TestOutcome]:
        return [test for test in self.outcomes.values() if test.not_run]

    def _message(self, report: pytest.TestReport | pytest.CollectReport) -> str:
        """Why a test did not pass, prefixed with the platform's name if it is not yet
        (a failing setup, teardown or import of the suite's own code)."""
        message = _message(report)
        prefix = f"platform {self.platform!r}: "
        return message if message.startswith(prefix) else prefix + message

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        global _active
        self.time_limit.stop()
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)
            self.stderr_fd = None
        if _active is self:
            _active = None
        if self.previous_env is None:
            os.environ.pop("SLOTWISE_PLATFORM", None)
        else:
            os.environ["SLOTWISE_PLATFORM"] = self.previous_env


def _where(exc: BaseException) -> str:
    """Where ``exc`` was raised and, if that is not in the suite's code, the line of the
    check that made the call: tells the platform's problems from the kit's."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    where = f" in {frames[-1].name} ({frames[-1].filename}:{frames[-1].lineno})"
    checks = [frame for frame in frames if check_of(Path(frame.filename)) is not None]
    if checks and checks[-1] is not frames[-1]:
        where += f", called by the check at {Path(checks[-1].filename).name}:{checks[-1].lineno}"
    return where


def _test_name(nodeid: str) -> str:
    return nodeid.partition("::")[2]


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
