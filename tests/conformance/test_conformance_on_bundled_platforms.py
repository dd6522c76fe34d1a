"""The conformance suite passes on the platforms this repository ships, both ways of running it.

``slotwise conformance NAME`` and ``pytest --slotwise-conformance`` run the same
suite; the pytest form runs here from an empty folder, as in a plugin repository
that has no tests of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conformance_runs import TIMEOUT_S, environment, messages, outcomes, run_cli

pytestmark = pytest.mark.slow

#: What every check gives on the CPU: it has no static graphs to check.
CPU_OUTCOMES = {
    "loading": "passed",
    "interface": "passed",
    "probe": "passed",
    "device": "passed",
    "attention": "passed",
    "custom_ops": "passed",
    "compile": "passed",
    "static_graphs": "skipped",
    "communicator": "passed",
}


def test_cli_passes_on_cpu():
    summary, result = run_cli("cpu")
    assert result.returncode == 0, result.stderr[-5000:]
    assert summary["passed"] is True
    assert outcomes(summary) == CPU_OUTCOMES
    assert "get_graph_api() returns None" in messages(summary, "static_graphs")


def test_pytest_option_passes_on_cpu_in_a_folder_without_tests(tmp_path: Path):
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--slotwise-conformance",
            "--slotwise-platform=cpu",
            f"--slotwise-conformance-report={report}",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-5000:]
    tests = json.loads(report.read_text())["tests"]
    assert {t["check"] for t in tests} == set(CPU_OUTCOMES)
    # CPU_SDPA declares no full-graph support: its full-graph layouts are not checked.
    layouts = "test_attention_on_the_full_graph_layouts_it_declares["
    for test in tests:
        skips = test["check"] == "static_graphs" or test["name"].startswith(layouts)
        assert test["outcome"] == ("skipped" if skips else "passed"), test


def test_cli_passes_on_ascend_stub():
    summary, result = run_cli("ascend_stub", SLOTWISE_ASCEND_STUB_DEVICES="2")
    assert result.returncode == 0, result.stderr[-5000:]
    assert set(outcomes(summary).values()) == {"passed"}, json.dumps(summary, indent=2)
