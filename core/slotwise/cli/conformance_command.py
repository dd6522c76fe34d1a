"""``slotwise conformance NAME``: run the platform conformance suite, summarised per check.

The suite runs in a pytest subprocess (``pytest --slotwise-conformance
--slotwise-platform=NAME``), so the checks get a fresh process whose platform is
NAME, as they would in a vendor's CI.  pytest's configuration is an empty one of
its own: the caller's pytest.ini, conftest.py files and addopts do not change what
is checked.  Arguments after ``--`` go to pytest (``-- -k attention -x``).  pytest's
output streams to stderr; the summary (a table, or JSON with ``--json``) goes to
stdout.  Exit status: 0 when no check failed, 1 when one did, 2 when the suite
could not run (the platform is unknown or unavailable, say).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from slotwise.cli.table import format_table
from slotwise.import_path import resolve_import_path
from slotwise.plugins.manager import stdout_to_stderr
from slotwise.testing.conformance import SUITE_DIRECTORY
from slotwise.testing.conformance.report import CheckSummary, read_report, summarise


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name,
        help="check a platform plugin with slotwise's conformance suite",
        description="Run the conformance suite against platform NAME and summarise it per "
        "check; arguments after -- go to pytest.",
    )
    parser.add_argument("platform", metavar="NAME", help="the platform, as in SLOTWISE_PLATFORM")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    # REMAINDER, not "*": argparse before Python 3.12 rejects `NAME --json -- ARGS` with "*".
    parser.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        metavar="-- PYTEST_ARGS",
        help="extra pytest arguments (-k attention, -x, ...)",
    )


def _split_pytest_args(args: argparse.Namespace) -> list[str]:
    """pytest's arguments; REMAINDER also hands over this command's --json after NAME."""
    extra = list(args.pytest_args)
    while extra[:1] == ["--json"]:
        args.json = True
        extra.pop(0)
    return extra[1:] if extra[:1] == ["--"] else extra


def run(args: argparse.Namespace) -> int:
    pytest_args = _split_pytest_args(args)
    with tempfile.TemporaryDirectory(prefix="slotwise-conformance-") as workdir:
        ini = Path(workdir) / "pytest.ini"
        ini.write_text("[pytest]\n")
        report_path = Path(workdir) / "report.json"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "slotwise",  # the pytest11 entry point, in case plugin autoloading is off
            "--slotwise-conformance",
            f"--slotwise-platform={args.platform}",
            f"--slotwise-conformance-report={report_path}",
            "-c",
            str(ini),
            # Test ids relative to the suite's own folder, where its files are.
            "--rootdir",
            str(SUITE_DIRECTORY),
            "-p",
            "no:cacheprovider",
            "-q",
            *pytest_args,
        ]
        exit_status, output = _stream(command)
        result = _result(args.platform, exit_status, output, report_path)
    print(json.dumps(result, indent=2) if args.json else render(result))
    if result["error"]:
        return 2
    return 0 if result["passed"] else 1


def _stream(command: list[str]) -> tuple[int, str]:
    """Run ``command``, copying its output to stderr as it comes; its status and output."""
    lines = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stderr.write(line)
            lines.append(line)
    sys.stderr.flush()
    return process.returncode, "".join(lines)


def _result(platform: str, exit_status: int, output: str, report_path: Path) -> dict[str, Any]:
    """The run as plain data: per check, its outcome, counts and tests."""
    tests = read_report(report_path)["tests"] if report_path.exists() else []
    checks = summarise(tests)
    error = None
    if not tests:
        # The plugin's usage errors (platform unknown, unavailable) end pytest with "ERROR: ...".
        prefix = "ERROR: slotwise conformance: "
        errors = [line[len(prefix) :] for line in output.splitlines() if line.startswith(prefix)]
        error = (
            _conformance_advice(platform, errors[-1])
            if errors
            else f"no conformance test ran (pytest exit status {exit_status}): "
            + " | ".join(output.strip().splitlines()[-3:])
        )
    return {
        "platform": platform,
        "passed": error is None and all(c.outcome in ("passed", "skipped") for c in checks),
        "exit_status": exit_status,
        "error": error,
        "checks": [_check_data(check) for check in checks],
    }


#: What resolution advises for a forced platform that is not available; it does not fit
#: here, where conformance itself set SLOTWISE_PLATFORM to the platform under test.
_UNSET_ADVICE = " Unset SLOTWISE_PLATFORM to pick the best available platform."


def _conformance_advice(platform: str, error: str) -> str:
    """Resolution's ``error`` with advice that fits a conformance run of ``platform``.

    An unavailable platform cannot be swapped for another here: the only fix is to make
    this one available, so the advice is the probe's reason (already in ``error``) and
    the platform's device variable, in place of "unset SLOTWISE_PLATFORM".
    """
    error = error.replace(
        "Set SLOTWISE_PLATFORM to one of the known names",
        "Give `slotwise conformance` one of the known names",
    )
    if _UNSET_ADVICE.strip() not in error:
        return error
    error = error.replace(_UNSET_ADVICE, "").replace(_UNSET_ADVICE.strip(), "").rstrip()
    error = error.removeprefix(f"SLOTWISE_PLATFORM={platform}: ")
    variable = _device_variable(platform)
    devices = (
        f"make its devices visible to this process ({variable} must not hide them)"
        if variable
        else "make its devices visible to this process"
    )
    return (
        f"{error} The conformance suite checks platform {platform!r} and no other, so run "
        f"it where that platform is available: fix what the probe reports, install the "
        f"device's driver and {devices}, then run `slotwise conformance {platform}` again."
    )


def _device_variable(platform: str) -> str:
    """The platform class's ``device_control_env_var``, or "" when it cannot be told."""
    from slotwise.platforms.resolution import get_resolver

    try:
        # Plugin code may print: keep stdout for the summary.
        with stdout_to_stderr():
            entry = get_resolver().entries.get(platform)
            if entry is None:
                return ""
            value = resolve_import_path(entry.spec.platform_cls, what="platform", fix="")
    except Exception:  # noqa: BLE001 - only advice: the error itself is already known
        return ""
    variable = getattr(value, "device_control_env_var", "")
    return variable if isinstance(variable, str) else ""


def _check_data(check: CheckSummary) -> dict[str, Any]:
    return {
        "check": check.check,
        "outcome": check.outcome,
        **{outcome: check.count(outcome) for outcome in ("passed", "failed", "skipped", "error")},
        "tests": [
            {
                "name": test.name,
                "outcome": test.outcome,
                "message": test.message,
                "duration": round(test.duration, 3),
            }
            for test in check.tests
        ],
    }


def render(result: dict[str, Any]) -> str:
    title = f"slotwise conformance: platform {result['platform']!r}"
    if result["error"]:
        return f"{title}\nthe suite did not run: {result['error']}"
    header = ["check", "result", "passed", "failed", "skipped", "errors"]
    rows = [
        [
            c["check"],
            c["outcome"],
            str(c["passed"]),
            str(c["failed"]),
            str(c["skipped"]),
            str(c["error"]),
        ]
        for c in result["checks"]
    ]
    lines = [title, "", format_table(header, rows)]
    problems = [
        f"  {c['check']} :: {t['name']}\n" + _indent(t["message"], "      ")
        for c in result["checks"]
        for t in c["tests"]
        if t["outcome"] in ("failed", "error")
    ]
    if problems:
        lines += ["", "problems:", *problems]
    # Skips of one check usually share their reason: one line per reason.
    skips = Counter(
        (c["check"], t["message"])
        for c in result["checks"]
        for t in c["tests"]
        if t["outcome"] == "skipped"
    )
    if skips:
        lines += ["", "skipped:"]
        lines += [
            f"  {check} ({n} test{'s' if n > 1 else ''}): {message}"
            for (check, message), n in skips.items()
        ]
    bad = [c["check"] for c in result["checks"] if c["outcome"] in ("failed", "error")]
    lines += ["", f"FAILED: {', '.join(bad)}" if bad else "PASSED"]
    return "\n".join(lines)


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in (text or "(no message)").splitlines())
