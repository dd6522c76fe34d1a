"""``slotwise serve`` in a subprocess for the server's tests: started on a free port
(``--port 0``; the port is read from the line the server prints when it listens),
its /metrics read as a scraper reads them, stopped with SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2
import openai

#: How long a server may take to load the model and start listening.
START_TIMEOUT_S = 180.0
BANNER = re.compile(r"slotwise serve: .* on (http://\S+)")


@dataclass
class ServeProcess:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def client(self, **options: object) -> openai.OpenAI:
        """The official client, without its retries (a 503 must reach the test)."""
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120, **options
        )

    def metrics(self) -> dict[str, float]:
        """``name{labels}`` -> value of every sample of /metrics."""
        text = httpx2.get(f"{self.url}/metrics", timeout=30).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def metric(self, name: str, **labels: str) -> float:
        """One sample; the model_name label is added."""
        pairs = [("model_name", "tiny"), *labels.items()]
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"
        return self.metrics().get(key, 0.0)

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """The metrics once no request runs or waits and no KV block is in use; fails
        with the last values otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            values = {
                name: self.metric(name)
                for name in (
                    "slotwise_num_requests_running",
                    "slotwise_num_requests_waiting",
                    "slotwise_kv_cache_usage",
                )
            }
            if not any(values.values()):
                return values
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not become idle: {values}")
            time.sleep(0.05)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"slotwise serve ignored SIGTERM for {timeout} s") from None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_serve(folder: Path, log: Path, *options: str) -> ServeProcess:
    """``slotwise serve --model folder --served-model-name tiny --port 0 options...``,
    once /health answers; its stdout and stderr go to ``log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    command = [
        sys.executable, "-m", "slotwise", "serve", "--model", str(folder),
        "--served-model-name", "tiny", "--port", "0", *options,
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        found = BANNER.search(log.read_text(errors="replace"))
        if found:
            break
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise AssertionError(f"slotwise serve did not start:\n{log.read_text()}")
        time.sleep(0.1)
    server = ServeProcess(process, found.group(1), log)
    assert httpx2.get(f"{server.url}/health", timeout=30).status_code == 200
    return server
