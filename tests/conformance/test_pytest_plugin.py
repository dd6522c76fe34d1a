"""The pytest plugin is loaded by every pytest run wherever slotwise is installed: it must
cost nothing and change nothing unless asked, and when asked for a platform that cannot
run it must stop the session instead of passing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conformance_runs import environment, run_cli

#: A user's test file that fails if the plugin imported torch or the suite.
USER_TESTS = """
    import sys

    def test_the_plugin_stayed_out_of_the_way():
        assert "torch" not in sys.modules
        assert "slotwise.testing.conformance" not in sys.modules

    def test_failing_on_purpose():
        assert False
"""


def pytest_in(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_plugin_is_registered_and_cheap():
    code = """
        import sys
        import importlib.metadata
        names = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
        assert "slotwise.testing.pytest_plugin" in names, names
        import slotwise.testing.pytest_plugin
        assert "torch" not in sys.modules
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=environment(), capture_output=True
    )
    assert result.returncode == 0, result.stderr


def test_without_the_option_nothing_changes(tmp_path: Path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    result = pytest_in(tmp_path, "-q", "--slotwise-platform=cpu")
    assert "1 failed, 1 passed" in result.stdout, result.stdout


def test_with_the_option_the_suite_replaces_the_default_test_paths(tmp_path: Path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    result = pytest_in(
        tmp_path, "-q", "--slotwise-conformance", "-k", "interface", SLOTWISE_PLATFORM="cpu"
    )
    assert result.returncode == 0, result.stdout
    # Every check of the interface module ran, and none of the user's tests.
    from slotwise.testing.conformance import test_interface

    checks = [name for name in vars(test_interface) if name.startswith("test_")]
    assert f"{len(checks)} passed" in result.stdout, result.stdout
    assert "test_user.py" not in result.stdout


def test_an_unavailable_platform_stops_the_session(tmp_path: Path):
    result = pytest_in(tmp_path, "--slotwise-conformance", "--slotwise-platform=ascend_stub")
    assert result.returncode == 4  # pytest's usage error: nothing ran, nothing passed
    assert "SLOTWISE_ASCEND_STUB_DEVICES is not set" in result.stderr


def test_the_option_needs_a_platform(tmp_path: Path):
    result = pytest_in(tmp_path, "--slotwise-conformance")
    assert result.returncode == 4
    assert "--slotwise-platform=NAME" in result.stderr


def test_cli_reports_an_unknown_platform_as_an_error():
    summary, result = run_cli("no_such_platform")
    assert result.returncode == 2
    assert summary["passed"] is False
    assert summary["checks"] == []
    assert "no such platform" in summary["error"]


def test_a_check_not_run_is_named_and_fails_the_session_only_under_require_all(tmp_path: Path):
    report = tmp_path / "report.json"
    args = ["--slotwise-conformance", "--slotwise-platform=ascend_stub", "-k", "communicator"]
    args.append(f"--slotwise-conformance-report={report}")
    one_device = {"SLOTWISE_ASCEND_STUB_DEVICES": "1"}

    result = pytest_in(tmp_path, *args, **one_device)
    assert result.returncode == 0, result.stdout
    assert "slotwise conformance: 1 check not run: communicator (needs 2 devices" in (result.stdout)
    (test,) = json.loads(report.read_text())["tests"]
    assert (test["outcome"], test["not_run"]) == ("skipped", True)

    result = pytest_in(tmp_path, *args, "--slotwise-require-all", **one_device)
    assert result.returncode == 1, result.stdout
    assert "1 check not run: communicator" in result.stdout
    assert "--slotwise-require-all: the run fails" in result.stdout
    assert json.loads(report.read_text())["exit_status"] == 1


def test_a_time_limit_that_is_not_a_number_of_seconds_is_refused_before_any_test(
    tmp_path: Path,
):
    result = pytest_in(
        tmp_path, "--slotwise-conformance", "--slotwise-platform=cpu", "--slotwise-timeout=-1"
    )
    assert result.returncode == 4
    assert "--slotwise-timeout=-1: expected a number of seconds >= 0 (0: no limit)" in (
        result.stderr
    )
    for where in (["cpu", "--timeout", "soon"], ["--timeout", "soon", "cpu"]):
        result = subprocess.run(
            [sys.executable, "-m", "slotwise", "conformance", *where],
            env=environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2
        assert "argument --timeout: expected 0 or a number in (0, 86400], got 'soon'" in (
            result.stderr
        )
        assert result.stdout == ""
