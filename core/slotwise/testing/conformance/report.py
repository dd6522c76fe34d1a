"""The results of a conformance run, per test and per check, as plain JSON data, written
by ``session`` and read by ``slotwise conformance``; only the standard library here."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slotwise.testing.conformance import CHECKS

#: Outcomes, worst first: a check takes the worst outcome of its tests.
OUTCOMES = ("error", "failed", "passed", "skipped")


@dataclass
class TestOutcome:
    """One test of the suite: its check, its name, how it ended and, unless it passed, why
    (``not_run``: a skip because the check could not run here, not because it does not apply)."""

    check: str
    name: str
    outcome: str
    message: str = ""
    duration: float = 0.0
    not_run: bool = False


@dataclass
class CheckSummary:
    """All the tests of one check; ``outcome`` is the worst of theirs."""

    check: str
    outcome: str
    tests: list[TestOutcome] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for test in self.tests if test.outcome == outcome)

    @property
    def not_run(self) -> list[TestOutcome]:
        return [test for test in self.tests if test.not_run]


def summarise(tests: list[TestOutcome]) -> list[CheckSummary]:
    """One summary per check that has tests, in the suite's order (all skipped: "skipped")."""
    summaries = []
    for check in sorted({t.check for t in tests}, key=_check_order):
        mine = [t for t in tests if t.check == check]
        worst = min((t.outcome for t in mine), key=OUTCOMES.index)
        summaries.append(CheckSummary(check, worst, mine))
    return summaries


def not_run_verdict(tests: list[TestOutcome]) -> str:
    """ "1 check not run: communicator (reason)" for the tests that could not run, or ""."""
    by_check: dict[str, list[TestOutcome]] = {}
    for test in tests:
        if test.not_run:
            by_check.setdefault(test.check, []).append(test)
    if not by_check:
        return ""
    parts = []
    for check in sorted(by_check, key=_check_order):
        mine = by_check[check]
        reason = _without_platform(mine[0].message)
        more = f"; {len(mine) - 1} more test(s) not run" if len(mine) > 1 else ""
        parts.append(f"{check} ({reason}{more})")
    count = len(by_check)
    return f"{count} check{'s' if count > 1 else ''} not run: " + ", ".join(parts)


def _without_platform(message: str) -> str:
    """A check's message without its "platform 'NAME': " prefix."""
    _, separator, rest = message.partition("': ")
    return rest if message.startswith("platform '") and separator else message


def _check_order(check: str) -> tuple[int, str]:
    return (CHECKS.index(check) if check in CHECKS else len(CHECKS), check)


@dataclass
class RunningTest:
    """The test in progress when the report was written, so a process that ends in the
    middle of a test still names it, the platform call it was in and when it began."""

    nodeid: str
    check: str
    name: str
    started: float
    time_limit_s: float
    calling: str = ""


def exceeded_message(platform: str, running: RunningTest) -> str:
    """The failure of ``running``, which exceeded its time limit."""
    calling = f" while calling {running.calling}" if running.calling else ""
    return (
        f"platform {platform!r}: {running.check} :: {running.name} exceeded "
        f"{running.time_limit_s:g} s{calling}, the time limit of each test (`slotwise "
        "conformance NAME --timeout S`, `pytest --slotwise-timeout=S`)"
    )


def write_report(
    path: Path,
    platform: str,
    exit_status: int | None,
    tests: list[TestOutcome],
    *,
    running: RunningTest | None = None,
    selected: int | None = None,
) -> None:
    """Write the report at ``path`` in one step (a reader never sees half of one):
    ``exit_status`` None while the session runs, ``selected`` the suite's tests after
    deselection, when known."""
    data = {
        "platform": platform,
        "exit_status": exit_status,
        "selected": selected,
        "running": asdict(running) if running is not None else None,
        "tests": [asdict(test) for test in tests],
    }
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2))
    os.replace(partial, path)


def read_report(path: Path) -> dict[str, Any]:
    """The report at ``path``, its tests as ``TestOutcome`` objects and its running
    test, if any, as a ``RunningTest``."""
    data = json.loads(Path(path).read_text())
    data["tests"] = [TestOutcome(**test) for test in data["tests"]]
    running = data.get("running")
    data["running"] = RunningTest(**running) if running else None
    return data
