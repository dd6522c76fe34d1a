"""``slotwise serve`` under pressure: a full queue (503), SIGTERM with requests running
and waiting, and the one-line message without FastAPI.

The servers run at level 0 on the tiny model with a 4096-token context, so that a
request asking for thousands of tokens is still running when the test acts on it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest
from serve_process import ServeProcess, start_serve

pytestmark = pytest.mark.slow

LONG = {"model": "tiny", "max_tokens": 4000, "temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def one_at_a_time(
    long_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """A server running one request at a time, with room for one more to wait."""
    log = tmp_path_factory.mktemp("serve-queue") / "serve.log"
    server = start_serve(long_checkpoint, log, "--max-num-seqs", "1", "--max-waiting", "1", "-O0")
    yield server
    assert server.stop() == 0, server.log_text()


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_full_queue_is_503_and_the_server_recovers(one_at_a_time):
    server = one_at_a_time
    client = server.client()
    running = client.completions.create(prompt="Hello", stream=True, **LONG)
    next(iter(running))  # the first request runs
    waiting_result: list[object] = []

    def wait_in_queue() -> None:
        with server.client() as own:
            try:
                answer = own.completions.create(prompt="Hi", max_tokens=2, model="tiny")
                waiting_result.append(answer)
            except openai.APIError as exc:
                waiting_result.append(exc)

    waiter = threading.Thread(target=wait_in_queue)
    waiter.start()
    wait_for(lambda: server.metric("slotwise_num_requests_waiting") == 1, "a waiting request")
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(prompt="Hey", max_tokens=2, model="tiny")
    error = caught.value.response.json()["error"]
    assert caught.value.status_code == 503
    assert (error["type"], error["code"]) == ("server_error", "queue_full")
    running.close()  # the running request is aborted: the waiting one runs
    waiter.join(timeout=60)
    assert isinstance(waiting_result[0], openai.types.Completion), waiting_result
    assert client.completions.create(prompt="Hey", max_tokens=2, model="tiny").choices
    server.wait_idle()


def test_sigterm_under_load_finishes_or_aborts_and_exits_0(long_checkpoint, tmp_path):
    server = start_serve(
        long_checkpoint, tmp_path / "serve.log",
        "--max-num-seqs", "3", "--shutdown-grace", "1", "-O0",
    )  # fmt: skip
    ends: dict[str, list[str | None]] = {}
    first_chunks = threading.Semaphore(0)
    failures: list[BaseException] = []

    def stream(name: str, max_tokens: int) -> None:
        try:
            with server.client() as own:
                chunks = own.completions.create(
                    prompt=f"Hello {name}", stream=True, **{**LONG, "max_tokens": max_tokens}
                )
                reasons = []
                for chunk in chunks:
                    if not reasons:
                        first_chunks.release()
                    reasons.append(chunk.choices[0].finish_reason)
                ends[name] = reasons
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    # Three long requests run and two wait when the signal comes; a short one
    # finished before.
    threads = [threading.Thread(target=stream, args=(f"long{i}", 4000)) for i in range(5)]
    short = threading.Thread(target=stream, args=("short", 8))
    short.start()
    short.join(timeout=60)
    for thread in threads:
        thread.start()
    for _ in range(3):
        assert first_chunks.acquire(timeout=60)
    wait_for(lambda: server.metric("slotwise_num_requests_waiting") == 2, "two waiting requests")
    started = time.monotonic()
    assert server.stop(timeout=60) == 0, server.log_text()
    assert time.monotonic() - started < 30
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert ends["short"][-1] == "length"
    for i in range(5):  # every stream ended with a finish reason and [DONE]
        assert ends[f"long{i}"][-1] == "abort", ends[f"long{i}"][-3:]
    assert "shutting down" in server.log_text()
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"{server.url}/health", timeout=5)


def test_without_fastapi_serve_says_what_to_install(tiny_checkpoint, tmp_path):
    """FastAPI hidden by a module of that name that fails to import."""
    (tmp_path / "fastapi.py").write_text("raise ImportError('hidden', name='fastapi')\n")
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "serve", "--model", str(tiny_checkpoint)],
        capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "slotwise serve: error: slotwise serve needs FastAPI and uvicorn (fastapi is missing): "
        "pip install 'slotwise-engine[serve]'"
    ]
