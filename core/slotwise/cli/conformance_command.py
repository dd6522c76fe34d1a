"""``slotwise conformance NAME``: run the platform conformance suite, summarised per check.

The suite runs in a pytest subprocess (``pytest --slotwise-conformance
--slotwise-platform=NAME``), so the checks get a fresh process whose platform is
NAME, as they would in a vendor's CI.  pytest's configuration is an empty one of
its own: the caller's pytest.ini, conftest.py files and addopts do not change what
is checked.  Arguments after ``--`` go to pytest (``-- -k attention -x``).  pytest's
output streams to stderr; the summary (a table, or JSON with ``--json``) goes to
stdout.  Exit status: 0 when no check failed, 1 when one did (or, with
``--require-all``, when a check could not run here), 2 when the suite could not run
(the platform is unknown or unavailable, say).  The verdict names the checks not run.

The command waits for pytest itself, not for the end of its output: a process the
plugin started that keeps pytest's stdout open does not keep the command waiting.  A
pytest that ends in the middle of a test (``os._exit``, a crash, the time limit's last
resort) leaves the test in its report: it fails, named with the platform call it was in,
and the summary says where the suite stopped.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from slotwise.cli.arguments import float_in
from slotwise.cli.table import format_table
from slotwise.errors import SlotwiseError
from slotwise.import_path import resolve_import_path
from slotwise.plugins.manager import stdout_to_stderr
from slotwise.testing import CONFORMANCE_TIME_LIMIT_S
from slotwise.testing.conformance import SUITE_DIRECTORY
from slotwise.testing.conformance.report import (
    CheckSummary,
    RunningTest,
    TestOutcome,
    exceeded_message,
    not_run_verdict,
    read_report,
    summarise,
)

#: This command's own options that argparse's REMAINDER may hand over after NAME.
_OWN_FLAGS = {"--json": "json", "--require-all": "require_all"}
#: ... and its option with a value.
_TIMEOUT_FLAG = "--timeout"
#: The largest time limit accepted, in seconds (a day).
MAX_TIME_LIMIT_S = 86400.0
#: Seconds to read what pytest wrote before it exited, once it has: a process it left
#: behind may hold its output open for ever.
_DRAIN_S = 2.0


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name,
        help="check a platform plugin with slotwise's conformance suite",
        description="Run the conformance suite against platform NAME and summarise it per "
        "check; arguments after -- go to pytest.",
    )
    parser.add_argument("platform", metavar="NAME", help="the platform, as in SLOTWISE_PLATFORM")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--require-all",
        action="store_true",
        help="fail (exit status 1) if a check could not run here, e.g. the communicator "
        "with fewer than 2 visible devices; checks that do not apply still skip",
    )
    parser.add_argument(
        _TIMEOUT_FLAG,
        type=_time_limit,
        default=CONFORMANCE_TIME_LIMIT_S,
        metavar="S",
        help=f"fail a test that runs longer than S seconds (default {CONFORMANCE_TIME_LIMIT_S:g}; "
        "0: no limit); one stuck in native code ends the run there",
    )
    # REMAINDER, not "*": argparse before Python 3.12 rejects `NAME --json -- ARGS` with "*".
    parser.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        metavar="-- PYTEST_ARGS",
        help="extra pytest arguments (-k attention, -x, ...)",
    )


_time_limit = float_in(0, MAX_TIME_LIMIT_S, low_open=True, zero=True)


def _split_pytest_args(args: argparse.Namespace) -> list[str]:
    """pytest's arguments; REMAINDER also hands over this command's options after NAME."""
    extra = list(args.pytest_args)
    while extra and (extra[0] in _OWN_FLAGS or extra[0].partition("=")[0] == _TIMEOUT_FLAG):
        flag, _, value = extra.pop(0).partition("=")
        if flag in _OWN_FLAGS:
            setattr(args, _OWN_FLAGS[flag], True)
            continue
        if not value:
            if not extra:
                raise ConformanceUsageError(f"{_TIMEOUT_FLAG} needs a number of seconds")
            value = extra.pop(0)
        try:
            args.timeout = _time_limit(value)
        except argparse.ArgumentTypeError as exc:
            raise ConformanceUsageError(f"argument {_TIMEOUT_FLAG}: {exc}") from None
    return extra[1:] if extra[:1] == ["--"] else extra


class ConformanceUsageError(SlotwiseError, ValueError):
    """An option of ``slotwise conformance`` given after NAME that is not valid."""


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
            f"--slotwise-timeout={args.timeout:g}",
            *(["--slotwise-require-all"] if args.require_all else []),
            *pytest_args,
        ]
        exit_status, output, ended = _stream(command)
        result = _result(
            args.platform, exit_status, output, report_path, args.require_all, ended=ended
        )
    print(json.dumps(result, indent=2) if args.json else render(result))
    if result["error"]:
        return 2
    return 0 if result["passed"] else 1


def _stream(command: list[str]) -> tuple[int, str, float]:
    """Run ``command``, copying its output to stderr as it comes; its exit status, its
    output and when it ended (``time.time()``).

    The output is read by a thread of its own, and the command's end is ``wait()``'s: a
    process ``command`` started that inherited its stdout would keep the pipe open after
    ``command`` exits.  That thread owns the pipe's descriptor and closes it at EOF, so
    nothing here blocks on it or closes it under a read.
    """
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(command, stdout=write_end, stderr=subprocess.STDOUT)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    chunks: list[str] = []
    reader = threading.Thread(
        target=_copy_output, args=(read_end, chunks), name="pytest-output", daemon=True
    )
    reader.start()
    exit_status = process.wait()
    ended = time.time()
    reader.join(_DRAIN_S)
    sys.stderr.flush()
    return exit_status, "".join(chunks), ended


def _copy_output(descriptor: int, chunks: list[str]) -> None:
    """Copy what arrives on ``descriptor`` to stderr and ``chunks`` until EOF."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while data := os.read(descriptor, 65536):
            text = decoder.decode(data)
            sys.stderr.write(text)
            sys.stderr.flush()
            chunks.append(text)
    except OSError:  # stderr went away: stop copying
        pass
    finally:
        os.close(descriptor)


def _result(
    platform: str,
    exit_status: int,
    output: str,
    report_path: Path,
    require_all: bool,
    *,
    ended: float | None = None,
) -> dict[str, Any]:
    """The run as plain data: per check, its outcome, counts and tests; the checks not
    run; where the suite stopped, if pytest ended in the middle of a test."""
    report = read_report(report_path) if report_path.exists() else None
    tests = report["tests"] if report else []
    stopped = None
    if report and report["running"] is not None:
        running = report["running"]
        tests = _with_stop(platform, tests, running, exit_status, ended)
        stopped = _stop_data(running, tests, report["selected"])
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
    not_run = [test for test in tests if test.not_run]
    passed = error is None and all(c.outcome in ("passed", "skipped") for c in checks)
    return {
        "platform": platform,
        "passed": passed and not (require_all and not_run),
        "exit_status": exit_status,
        "error": error,
        "require_all": require_all,
        "not_run": [_not_run_data(test) for test in not_run],
        "verdict": _verdict(checks, not_run, require_all, stopped) if error is None else "ERROR",
        "stopped": stopped,
        "checks": [_check_data(check) for check in checks],
    }


def _with_stop(
    platform: str,
    tests: list[TestOutcome],
    running: RunningTest,
    exit_status: int,
    ended: float | None,
) -> list[TestOutcome]:
    """``tests`` with the test pytest ended in: failed, with why, unless the time limit
    recorded it before ending the process."""
    if any(test.check == running.check and test.name == running.name for test in tests):
        return tests
    calling = f", while calling {running.calling}" if running.calling else ""
    elapsed = (ended if ended is not None else time.time()) - running.started
    if running.time_limit_s and elapsed >= running.time_limit_s:
        message = exceeded_message(platform, running) + (
            "; it never returned to Python: it is stuck in native code that holds the GIL, "
            "so the time limit's last resort (faulthandler) ended the test process; the "
            "tracebacks of its threads are in pytest's output"
        )
    else:
        message = (
            f"platform {platform!r}: the test process ended ({_status(exit_status)}) during "
            f"{running.check} :: {running.name}{calling}, without a Python exception: "
            "what it ran ended the process (os._exit, exit() or abort() in native code, "
            "or a crash such as a segmentation fault, whose traceback pytest's output shows)"
        )
    return [*tests, TestOutcome(running.check, running.name, "failed", message, elapsed)]


def _status(exit_status: int) -> str:
    if exit_status < 0:
        try:
            return f"killed by {signal.Signals(-exit_status).name}"
        except ValueError:
            return f"killed by signal {-exit_status}"
    return f"exit status {exit_status}"


def _stop_data(
    running: RunningTest, tests: list[TestOutcome], selected: int | None
) -> dict[str, Any]:
    """Where the suite stopped, how many of its selected tests never ran, how to go on."""
    not_run = max(0, selected - len(tests)) if selected is not None else None
    return {
        "check": running.check,
        "name": running.name,
        "calling": running.calling,
        "tests_not_run": not_run,
        "rerun": f"-- --deselect {shlex.quote(running.nodeid)}",
    }


def _not_run_data(test: TestOutcome) -> dict[str, str]:
    return {"check": test.check, "name": test.name, "reason": test.message}


def _verdict(
    checks: list[CheckSummary],
    not_run: list[TestOutcome],
    require_all: bool,
    stopped: dict[str, Any] | None = None,
) -> str:
    """The last line: PASSED or FAILED, the failed checks, where the suite stopped, and
    the checks not run here."""
    bad = [c.check for c in checks if c.outcome in ("failed", "error")]
    missing = not_run_verdict(not_run)
    if bad:
        verdict = f"FAILED: {', '.join(bad)}"
        if stopped is not None:
            count = stopped["tests_not_run"]
            rest = (
                "the tests after it"
                if count is None
                else f"{count} more test{'' if count == 1 else 's'}"
            )
            verdict += (
                f"; the suite stopped at {stopped['check']} :: {stopped['name']} and "
                f"{rest} did not run (rerun with `{stopped['rerun']}` to check them)"
            )
        return f"{verdict}; {missing}" if missing else verdict
    if not missing:
        return "PASSED"
    if require_all:
        return f"FAILED, {missing} (--require-all: every check must run)"
    return f"PASSED, {missing}"


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
        "not_run": len(check.not_run),
        "tests": [
            {
                "name": test.name,
                "outcome": test.outcome,
                "message": test.message,
                "duration": round(test.duration, 3),
                "not_run": test.not_run,
            }
            for test in check.tests
        ],
    }


def render(result: dict[str, Any]) -> str:
    title = f"slotwise conformance: platform {result['platform']!r}"
    if result["error"]:
        return f"{title}\nthe suite did not run: {result['error']}"
    header = ["check", "result", "passed", "failed", "skipped", "not run", "errors"]
    rows = [
        [
            c["check"],
            "not run" if c["not_run"] and c["outcome"] == "skipped" else c["outcome"],
            str(c["passed"]),
            str(c["failed"]),
            str(c["skipped"] - c["not_run"]),
            str(c["not_run"]),
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
    for heading, not_run in (("skipped (does not apply):", False), ("not run here:", True)):
        skips = Counter(
            (c["check"], t["message"])
            for c in result["checks"]
            for t in c["tests"]
            if t["outcome"] == "skipped" and t["not_run"] == not_run
        )
        if skips:
            lines += ["", heading]
            lines += [
                f"  {check} ({n} test{'s' if n > 1 else ''}): {message}"
                for (check, message), n in skips.items()
            ]
    lines += ["", result["verdict"]]
    return "\n".join(lines)


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in (text or "(no message)").splitlines())
