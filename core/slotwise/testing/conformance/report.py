"""The results of a conformance run, per test and per check, as plain JSON data.

The pytest side (``session``) writes them; ``slotwise conformance`` reads them back
from its pytest subprocess and summarises them.  Neither side needs the other's
imports: this module uses only the standard library.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slotwise.testing.conformance import CHECKS

#: Outcomes, worst first: a check takes the worst outcome of its tests.
OUTCOMES = ("error", "failed", "passed", "skipped")


@dataclass
class TestOutcome:
    """One test of the suite: its check, its name, how it ended and, unless it passed, why.

    ``not_run`` marks a skip that is no "does not apply": the check could not run on
    this machine (``target.not_run``), which ``--require-all`` turns into a failure.
    """

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
    """One summary per check that has tests, in the suite's order.

    A check passes when none of its tests failed or errored and at least one passed;
    a check whose tests were all skipped is "skipped", not "passed".
    """
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


def write_report(path: Path, platform: str, exit_status: int, tests: list[TestOutcome]) -> None:
    data = {
        "platform": platform,
        "exit_status": exit_status,
        "tests": [asdict(test) for test in tests],
    }
    Path(path).write_text(json.dumps(data, indent=2))


def read_report(path: Path) -> dict[str, Any]:
    """The report at ``path``, its tests as ``TestOutcome`` objects."""
    data = json.loads(Path(path).read_text())
    data["tests"] = [TestOutcome(**test) for test in data["tests"]]
    return data
