"""Ctrl-C and a closed stdout end `slotwise generate` in one line, and spoil no cache.

Each run is a real `python -m slotwise` process in a session of its own, sent SIGINT
the way a terminal sends Ctrl-C (to its whole process group, compiler processes
included) once its stderr shows it reached the phase under test.  The same command
is then run again to completion on the same cache root: it must succeed and print
what an uninterrupted run printed, which it cannot do from a half-written entry.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from models.hf_checkpoints import make_checkpoint
from models.hf_tokenizers import make_tokenizer
from support import clean_env

pytestmark = pytest.mark.slow

PROMPT = "Hello world, the quick fox"
#: The tiny checkpoint's context holds the prompt and these, decoded in about a second.
TOKENS = 200
KERNEL_BUILD = "building the plugin's kernels"
COLD_COMPILE = "Inductor's cache"  # where it goes, logged as the first piece compiles
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = make_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    return make_tokenizer(folder, "llama3")


def command(checkpoint: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "slotwise", "generate", "--model", str(checkpoint),
        "--prompt", PROMPT, "--max-new-tokens", str(TOKENS), "--ignore-eos", *extra,
    ]  # fmt: skip


def environment(root: Path, **extra: str) -> dict[str, str]:
    """slotwise's settings cleared but for the cache root; Inductor's cache goes beside
    it (as it does for a user), not into the folder the test run shares."""
    env = clean_env(SLOTWISE_CACHE_ROOT=str(root), **extra)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return env


def run(args: list[str], root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, env=environment(root), timeout=TIMEOUT_S
    )


@pytest.fixture(scope="module")
def uninterrupted(checkpoint, tmp_path_factory) -> tuple[Path, dict]:
    """A cache root with the CPU kernels built, and the JSON of an uninterrupted run."""
    root = tmp_path_factory.mktemp("warm-root")
    result = run(command(checkpoint, "-O0", "--json"), root)
    assert result.returncode == 0, result.stderr
    return root, json.loads(result.stdout)


@pytest.fixture(scope="module")
def streamed(checkpoint, uninterrupted) -> bytes:
    """What an uninterrupted run streams to stdout, as bytes (the tiny tokenizer's text is
    not always valid UTF-8)."""
    result = subprocess.run(
        command(checkpoint, "-O0"),
        capture_output=True,
        env=environment(uninterrupted[0]),
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def warm_root(uninterrupted, tmp_path: Path) -> Path:
    """A fresh cache root holding the built kernels and nothing else."""
    root = tmp_path / "root"
    shutil.copytree(uninterrupted[0] / "cpu-kernels", root / "cpu-kernels")
    return root


def interrupt(args: list[str], root: Path, *, stderr_says: str = "", stdout_starts=False):
    """Run ``args``; Ctrl-C it once stderr shows ``stderr_says`` (then after a moment,
    so the phase is under way) or its stdout has begun. (exit status, stderr after the
    signal, whether the signal was sent)."""
    process = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Watching stdout, it reads stderr at the end only: the log would be there too.
        env=environment(root, **({"SLOTWISE_LOGGING_LEVEL": "WARNING"} if stdout_starts else {})),
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # Ctrl-C as a terminal delivers it, even where this test runs in the background
        # (a shell starts background jobs with SIGINT ignored, and children inherit it).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    sent = False
    try:
        watched = process.stdout if stdout_starts else process.stderr
        assert watched is not None
        while not sent:
            text = watched.read(1) if stdout_starts else watched.readline()
            if not text:
                break  # it ended before reaching the phase
            if stdout_starts or stderr_says.encode() in text:
                time.sleep(0 if stdout_starts else 0.5)
                os.killpg(process.pid, signal.SIGINT)
                sent = True
        _, after = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, after.decode("utf-8", "replace"), sent


def assert_one_line_and_130(code: int, stderr: str, sent: bool) -> None:
    assert sent, "the command ended before it reached the phase to interrupt"
    assert code == 130, stderr
    assert stderr == "slotwise generate: interrupted\n", stderr


def test_ctrl_c_during_the_kernel_build(checkpoint, uninterrupted, tmp_path):
    root = tmp_path / "cold-root"
    args = command(checkpoint, "-O0", "--json")
    assert_one_line_and_130(*interrupt(args, root, stderr_says=KERNEL_BUILD))
    rerun = run(args, root)
    assert rerun.returncode == 0, rerun.stderr
    assert KERNEL_BUILD in rerun.stderr  # nothing half-built was taken for the kernels
    assert json.loads(rerun.stdout)["token_ids"] == uninterrupted[1]["token_ids"]


def test_ctrl_c_during_a_cold_compile(checkpoint, uninterrupted, tmp_path):
    root = warm_root(uninterrupted, tmp_path)
    args = command(checkpoint, "-O3", "-O.backend=eager", "--json")
    assert_one_line_and_130(*interrupt(args, root, stderr_says=COLD_COMPILE))
    rerun = run(args, root)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["token_ids"] == uninterrupted[1]["token_ids"]


def test_ctrl_c_during_generation(checkpoint, uninterrupted, streamed, tmp_path):
    root = warm_root(uninterrupted, tmp_path)
    args = command(checkpoint, "-O0")
    assert_one_line_and_130(*interrupt(args, root, stdout_starts=True))
    rerun = subprocess.run(args, capture_output=True, env=environment(root), timeout=TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout == streamed


def test_a_reader_that_stops_early_ends_it_quietly(checkpoint, uninterrupted, streamed, tmp_path):
    root = warm_root(uninterrupted, tmp_path)
    shell = " ".join(f"'{arg}'" for arg in command(checkpoint, "-O0")) + " | head -c1"
    result = subprocess.run(
        ["bash", "-c", f'set -o pipefail; {shell}; echo "status $?" >&2'],
        capture_output=True,
        env=environment(root, SLOTWISE_LOGGING_LEVEL="ERROR"),
        timeout=TIMEOUT_S,
    )
    assert result.stdout == streamed[:1]
    # 128 + SIGPIPE, as for any program a closed pipe stops; nothing else on stderr.
    assert result.stderr.decode() == "status 141\n"
