"""pytest plugin of slotwise (entry point ``pytest11``): the platform conformance suite.

``pytest --slotwise-conformance --slotwise-platform=NAME`` runs the checks of
``slotwise.testing.conformance`` against platform NAME: only them, unless test
paths are named on the command line too.  The platform must be installed and
available: a resolution error ends the session before any test runs.  Each test of
the suite runs under ``--slotwise-timeout`` (``conformance.time_limit``).

pytest imports this module in every run wherever slotwise is installed, so it
stays cheap (no torch, no platform resolution at import) and does nothing unless
``--slotwise-conformance`` is given.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

from slotwise.testing import CONFORMANCE_TIME_LIMIT_S


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("slotwise", "slotwise platform conformance")
    group.addoption(
        "--slotwise-conformance",
        action="store_true",
        default=False,
        help="run slotwise's platform conformance suite against --slotwise-platform",
    )
    group.addoption(
        "--slotwise-platform",
        metavar="NAME",
        default=None,
        help="the platform to check (default: $SLOTWISE_PLATFORM)",
    )
    group.addoption(
        "--slotwise-conformance-report",
        metavar="PATH",
        default=None,
        help="also write the conformance results, per check, to PATH as JSON",
    )
    group.addoption(
        "--slotwise-timeout",
        metavar="S",
        default=None,
        help=f"fail a test of the suite that runs longer than S seconds (default "
        f"{CONFORMANCE_TIME_LIMIT_S:g}; 0: no limit); one stuck in native code ends the run",
    )
    group.addoption(
        "--slotwise-require-all",
        action="store_true",
        default=False,
        help="fail the run if a check could not run here (e.g. the communicator with one "
        "visible device); checks that do not apply to the platform may still skip",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("slotwise_conformance"):
        return
    previous_env = os.environ.get("SLOTWISE_PLATFORM")
    name = config.getoption("slotwise_platform") or (previous_env or "").strip()
    if not name:
        raise pytest.UsageError(
            "--slotwise-conformance needs the platform to check: --slotwise-platform=NAME"
        )
    time_limit_s = _time_limit(config.getoption("slotwise_timeout"))
    if config.getoption("usepdb", False) or config.getoption("trace", False):
        time_limit_s = 0  # whoever sits in a debugger is no hang
    os.environ["SLOTWISE_PLATFORM"] = name
    _require_platform(name)

    from slotwise.testing.conformance import SUITE_DIRECTORY
    from slotwise.testing.conformance.session import ConformanceSession

    if config.args_source == pytest.Config.ArgsSource.ARGS:
        config.args.append(str(SUITE_DIRECTORY))
    else:  # pytest's default (testpaths or the current folder): the suite alone
        config.args[:] = [str(SUITE_DIRECTORY)]
    report = config.getoption("slotwise_conformance_report")
    config.pluginmanager.register(
        ConformanceSession(
            name,
            Path(report) if report else None,
            previous_env,
            require_all=config.getoption("slotwise_require_all"),
            time_limit_s=time_limit_s,
            # pytest's capture redirects stderr during each test: the time limit's
            # messages go to the stderr of now, as pytest's faulthandler plugin does.
            stderr_fd=os.dup(_stderr_fileno()) if time_limit_s else None,
        ),
        "slotwise-conformance-session",
    )


def _require_platform(name: str) -> None:
    """Resolve the platform now, so that a missing or unavailable one is a usage error
    (the run fails at once, with resolution's message) rather than a run that checks
    nothing or another platform."""
    from slotwise.platforms import PlatformError, get_current_platform

    try:
        platform = get_current_platform()
    except PlatformError as exc:
        raise pytest.UsageError(f"slotwise conformance: {exc}") from exc
    if platform.name != name:
        raise pytest.UsageError(
            f"slotwise conformance: this process resolved its platform to {platform.name!r} "
            f"before the conformance run could select {name!r}; run pytest in a fresh process"
        )


def _time_limit(value: str | None) -> float:
    """The seconds of ``--slotwise-timeout`` (default ``CONFORMANCE_TIME_LIMIT_S``; 0: none)."""
    if value is None:
        return CONFORMANCE_TIME_LIMIT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise pytest.UsageError(
            f"--slotwise-timeout={value}: expected a number of seconds >= 0 (0: no limit)"
        )
    return seconds


def _stderr_fileno() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, ValueError):  # replaced by an object without a descriptor
        assert sys.__stderr__ is not None
        return sys.__stderr__.fileno()
