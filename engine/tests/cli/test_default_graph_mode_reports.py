"""`slotwise env` and `slotwise bench` name the graph mode a config without one gets,
and why, in the table and in the JSON (`slotwise matrix`: tests/cli/test_matrix_command.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import clean_env

STUB = {"SLOTWISE_PLATFORM": "ascend_stub", "SLOTWISE_ASCEND_STUB_DEVICES": "1"}
#: Per platform: the default mode, the variant the bench measures it with, and its reason.
EXPECTED = {
    "cpu": ("NONE", "level3", "platform cpu has no static graphs (get_graph_api() is None)"),
    "ascend_stub": (
        "FULL_AND_PIECEWISE",
        "level3+full_graphs",
        "platform ascend_stub has static graphs and attention backend ASCEND_STUB_REFERENCE "
        "(UNIFORM_DECODE) may be captured in full graphs of uniform-decode batches",
    ),
}


def slotwise(platform: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(SLOTWISE_DISABLE_COMPILE_CACHE="1", **(STUB if platform != "cpu" else {}))
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.parametrize("platform", list(EXPECTED))
def test_env_names_the_default_graph_mode_and_why(platform):
    mode, _, reason = EXPECTED[platform]
    info = json.loads(slotwise(platform, "env", "--json").stdout)
    assert info["default_graph_mode"] == {"mode": mode, "reason": reason}
    assert f"graphs   {mode} by default: {reason}\n" in slotwise(platform, "env").stdout


@pytest.mark.parametrize("platform", list(EXPECTED))
def test_bench_names_the_default_graph_mode_its_variant_and_why(platform):
    mode, variant, reason = EXPECTED[platform]
    args = ("bench", "--preset", "tiny", "--batch-sizes", "1", "--iterations", "1")
    args += ("--variants", "eager", "--threads", "1")
    report = json.loads(slotwise(platform, *args, "--json").stdout)
    assert report["default_graph_mode"] == {"mode": mode, "reason": reason, "variant": variant}
    assert f"\ndefault graph mode {mode}: {reason}\n" in slotwise(platform, *args).stdout
