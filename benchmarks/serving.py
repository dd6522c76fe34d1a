"""Serving under load: `slotwise serve` against `transformers serve --continuous-batching`.

Why: a server is judged by what its clients see when requests arrive at random, not by
one decode step.  The script drives OpenAI-compatible ``/v1/completions`` endpoints with
streamed requests whose arrivals are a Poisson process at each request rate of
``--rates`` (``inf``: all at once, the server's saturation) and measures, from the
stream, requests/s, output tokens/s, time to first token (TTFT), inter-token latency
(ITL: the gaps between streamed chunks, as vLLM's benchmark counts them), time per
output token (TPOT: a request's decode time over its tokens after the first) and
end-to-end latency, with their p50/p90/p99.

The load is the same for every server: prompt and output lengths drawn with ``--seed``
(uniform within ``--range-ratio`` of ``--input-len`` and ``--output-len``), prompts made
of words from a fixed list (text, so each server tokenizes it itself), greedy sampling,
and each output forced to its length: ``ignore_eos`` in the request body for slotwise,
``generation_config={"eos_token_id": -1}`` for transformers (its server takes no
``ignore_eos``).  Each request also asks for ``stream_options.include_usage``, and the
output tokens counted are the server's ``usage.completion_tokens``.

Both servers run on the same checkpoint on this machine, started once each on
127.0.0.1 (a free port), each warmed up, both up for the whole run; the rates are run in
turn and each rate on both servers, in an order that alternates from one rate to the
next, so that drift falls on both alike.  The idle server's CPU seconds during the
other's runs are recorded.  The checkpoint is a random Llama of a slotwise preset's
shape (``--preset``, in ``--dtype``) with a word-level tokenizer of its vocabulary
written at run time (every token decodes to one word, so each token is one streamed
chunk), or a real checkpoint folder (``--model``).  ``--url`` drives one server that is
already running instead.

``--sequential N`` adds a run of N requests sent one after another (one in flight at
a time), reported as rate "serial".  From slotwise's ``/metrics`` each of its runs also
reports the engine's steps (``slotwise_engine_step*``): how many requests a decode step
ran and how long it took, and the share of the run's wall time the engine spent in
steps.  ``--roofline`` then sets slotwise's decode steps at saturation against the memory
roofline of ``slotwise bench`` (``slotwise_engine.bench.decode``: the bytes a step of
that batch and context reads over the probed read bandwidth), and the serial run's
ITL against the server's own decode step at batch 1 (what the HTTP layer adds).

Targets (docs/benchmarks.md): output tokens/s at saturation at least 2x transformers',
and at every rate p90 TTFT and p90 ITL no worse than transformers'; with one request
in flight (``--sequential``) slotwise's p50 ITL within 1.15x of the engine's decode step
at batch 1, and slotwise's decode steps at saturation at 0.5 or more of the memory
roofline for the batch they run (both with ``--roofline``).

Results go to ``<out-dir>/serving.json``, ``.md`` and ``serving.png`` (throughput and p90
latencies against the request rate; with matplotlib installed).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    LOG,
    add_output_args,
    configure_logging,
    environment,
    package_version,
    publish,
    require_positive,
    utc_timestamp,
    verdict,
)

from slotwise.stats import percentile

SERVERS = ("slotwise", "transformers")
#: Saturation throughput of slotwise over transformers' (the issue's target).
TARGET_THROUGHPUT_RATIO = 2.0
#: The most the p50 ITL with one request in flight may be over the engine's batch-1 step.
TARGET_SERIAL_ITL_RATIO = 1.15
#: The least share of the memory roofline a decode step at saturation should reach.
TARGET_ROOFLINE_FRACTION = 0.5
#: The rate label of the ``--sequential`` run.
SERIAL = "serial"
PERCENTILES = (50, 90, 99)
#: Request-body fields that make each server generate exactly ``max_tokens`` tokens.
IGNORE_EOS = {
    "slotwise": {"ignore_eos": True},
    "transformers": {"generation_config": json.dumps({"eos_token_id": -1})},
    "other": {},
}


#: text -> its number of tokens
TokenCount = Callable[[str], int]
#: The most words prompts are drawn from.
PROMPT_WORDS = 4096


# ----- the checkpoint -----


def vocabulary(size: int) -> list[str]:
    """``size`` distinct lowercase words (syllables in a fixed order): the word-level
    tokenizer's vocabulary and the words prompts are made of."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    words = list(syllables)
    for first in syllables:
        for second in syllables:
            words.append(first + second)
    for first in syllables:
        for second in syllables:
            for third in syllables:
                if len(words) >= size:
                    return words[:size]
                words.append(first + second + third)
    return words[:size]


def write_checkpoint(folder: Path, preset: str, dtype: str, seed: int) -> Path:
    """A random Llama of ``preset``'s shape saved in ``dtype`` by transformers, with a
    word-level tokenizer of its vocabulary; returns ``folder``."""
    import tokenizers
    import torch
    import transformers

    from slotwise_engine.models.llama import PRESETS

    shape = PRESETS[preset]
    config = transformers.LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position,
        rms_norm_eps=shape.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=shape.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=1,
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)

    words = vocabulary(shape.vocab_size)
    backend = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=words[0])
    )
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.decoder = tokenizers.decoders.WordPiece(prefix="##", cleanup=False)
    backend.save(str(folder / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    return folder


# ----- the load -----


@dataclass(frozen=True)
class Request:
    """One request of the load: when it is sent (seconds after the start) and what."""

    arrival_s: float
    prompt: str
    prompt_tokens: int
    max_tokens: int


def length_range(mean: int, range_ratio: float) -> tuple[int, int]:
    """The shortest and longest length within ``range_ratio`` of ``mean`` (at least 1)."""
    low = max(1, round(mean * (1 - range_ratio)))
    return low, max(low, round(mean * (1 + range_ratio)))


def lengths(rng: random.Random, count: int, mean: int, range_ratio: float) -> list[int]:
    """``count`` lengths uniform within ``range_ratio`` of ``mean``."""
    return [rng.randint(*length_range(mean, range_ratio)) for _ in range(count)]


def make_prompts(
    counts: Sequence[int], words: Sequence[str], rng: random.Random, token_count: TokenCount
) -> list[tuple[str, int]]:
    """A text of random ``words`` for each count: the shortest that ``token_count``
    (text -> tokens) finds at least that long; with its token count."""
    prompts = []
    for count in counts:
        chosen = [rng.choice(words) for _ in range(count)]
        while token_count(" ".join(chosen)) < count:
            chosen.append(rng.choice(words))
        while len(chosen) > 1 and token_count(" ".join(chosen[:-1])) >= count:
            chosen.pop()
        text = " ".join(chosen)
        prompts.append((text, token_count(text)))
    return prompts


def arrivals(rng: random.Random, count: int, rate: float) -> list[float]:
    """Send times of a Poisson process of ``rate`` requests/s (all 0 for ``inf``)."""
    if math.isinf(rate):
        return [0.0] * count
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def build_load(
    args: argparse.Namespace, rate: float, words: Sequence[str], token_count: TokenCount
) -> list[Request]:
    """The same requests for every server at ``rate``: lengths and words from ``--seed``,
    arrival times from ``--seed`` and the rate."""
    rng = random.Random(args.seed)
    prompt_lens = lengths(rng, args.num_prompts, args.input_len, args.range_ratio)
    output_lens = lengths(rng, args.num_prompts, args.output_len, args.range_ratio)
    prompts = make_prompts(prompt_lens, words, rng, token_count)
    times = arrivals(random.Random(f"{args.seed}/{rate}"), args.num_prompts, rate)
    return [
        Request(when, text, tokens, out)
        for when, (text, tokens), out in zip(times, prompts, output_lens, strict=True)
    ]


# ----- one server -----


class ServerError(RuntimeError):
    """A server could not be started, failed its warm-up, or died."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def executable(name: str) -> str:
    """The console script ``name`` beside this Python (its venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise ServerError(f"`{name}` is not installed beside {sys.executable} nor on PATH")
    return found


def server_command(name: str, model: Path, port: int, extra: Sequence[str]) -> list[str]:
    """The command line that serves ``model`` on 127.0.0.1:``port``: the server's
    defaults, then ``extra``."""
    if name == "slotwise":
        return [
            executable("slotwise"),
            "serve",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *extra,
        ]
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [
        executable("transformers"),
        "serve",
        "--continuous-batching",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        device,
        "--log-level",
        "warning",
        *extra,
        str(model),
    ]


@dataclass
class Server:
    """A server process on 127.0.0.1, its log in a file, stopped with SIGTERM."""

    name: str
    command: list[str]
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> None:
        """Start the process and wait until ``/health`` answers 200."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
        LOG.info("starting %s: %s", self.name, " ".join(self.command))
        started = time.perf_counter()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        while time.perf_counter() - started < timeout_s:
            if self.process.poll() is not None:
                raise ServerError(
                    f"{self.name} exited with {self.process.returncode} before it was "
                    f"ready:\n{self.log_tail()}"
                )
            if http_status(f"{self.url}/health") == 200:
                self.startup_s = time.perf_counter() - started
                LOG.info("%s ready after %.1f s", self.name, self.startup_s)
                return
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"{self.name} not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit code (None if never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                LOG.warning("%s ignored SIGTERM for %.0f s: killed", self.name, grace_s)
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def cpu_seconds(self) -> float | None:
        """User and system CPU seconds of the process and its descendants (Linux)."""
        if self.process is None:
            return None
        try:
            return sum(process_cpu_seconds(pid) for pid in process_tree(self.process.pid))
        except OSError:
            return None

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except (urllib.error.URLError, OSError):
        return None


def process_tree(pid: int) -> Iterator[int]:
    """``pid`` and its descendants, from /proc's children lists."""
    yield pid
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for child in children:
            yield from process_tree(int(child))


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served_model(url: str) -> str:
    """The first model id that ``/v1/models`` lists."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
        return json.load(response)["data"][0]["id"]


# ----- the client -----


@dataclass
class Outcome:
    """What the client saw of one request (times in seconds from its send)."""

    ttft_s: float | None = None
    #: from the first streamed text to the last
    decode_s: float | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0
    error: str | None = None


async def send(
    client: Any, model: str, request: Request, extra_body: dict[str, Any], start: float
) -> Outcome:
    """Send ``request`` at its arrival time and time its stream."""
    await asyncio.sleep(max(0.0, start + request.arrival_s - time.perf_counter()))
    outcome = Outcome()
    sent = time.perf_counter()
    first = last = None
    chunks = 0
    usage_tokens = None
    try:
        stream = await client.completions.create(
            model=model,
            prompt=request.prompt,
            max_tokens=request.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra_body,
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage_tokens = chunk.usage.completion_tokens
            if not chunk.choices or not chunk.choices[0].text:
                continue
            chunks += 1
            if first is None:
                first = now
                outcome.ttft_s = now - sent
            else:
                outcome.chunk_gaps_s.append(now - last)
            last = now
        outcome.e2e_s = time.perf_counter() - sent
        if first is not None:
            outcome.decode_s = last - first
        outcome.output_tokens = usage_tokens if usage_tokens is not None else chunks
    except Exception as error:  # noqa: BLE001 - a failed request is counted, not fatal
        outcome.error = f"{type(error).__name__}: {error}"
    return outcome


async def run_load(
    url: str,
    model: str,
    load: Sequence[Request],
    extra_body: dict[str, Any],
    timeout_s: float,
    *,
    sequential: bool = False,
) -> tuple[list[Outcome], float]:
    """Every request of ``load`` at its time (``sequential``: each as soon as the one
    before has ended); the outcomes and the seconds from the first send to the last
    answer."""
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=timeout_s
    )
    async with client:
        start = time.perf_counter()
        if sequential:
            outcomes = []
            for request in load:  # its arrival_s counts from the one before's end
                outcomes.append(await send(client, model, request, extra_body, time.perf_counter()))
        else:
            outcomes = await asyncio.gather(
                *(send(client, model, request, extra_body, start) for request in load)
            )
        duration = time.perf_counter() - start
    return list(outcomes), duration


def spread(samples: Sequence[float]) -> dict[str, float] | None:
    """p50/p90/p99 of ``samples`` in milliseconds (None without samples)."""
    if not samples:
        return None
    return {f"p{p}": round(1000 * percentile(list(samples), p), 2) for p in PERCENTILES}


def summarise(
    rate: float | str, load: Sequence[Request], outcomes: Sequence[Outcome], duration: float
) -> dict[str, Any]:
    """One server's figures at one rate."""
    done = [o for o in outcomes if o.error is None]
    tokens = sum(o.output_tokens for o in done)
    tpot = [
        o.decode_s / (o.output_tokens - 1)
        for o in done
        if o.decode_s is not None and o.output_tokens > 1
    ]
    errors = sorted({o.error for o in outcomes if o.error is not None})
    return {
        "rate": rate if isinstance(rate, str) else rate_text(rate),
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "errors": errors[:5],
        "duration_s": round(duration, 3),
        "requests_per_s": round(len(done) / duration, 3),
        "output_tokens_per_s": round(tokens / duration, 2),
        "output_tokens": tokens,
        "output_lengths_exact": all(
            o.output_tokens == r.max_tokens
            for o, r in zip(outcomes, load, strict=True)
            if o.error is None
        ),
        "ttft_ms": spread([o.ttft_s for o in done if o.ttft_s is not None]),
        "itl_ms": spread([gap for o in done for gap in o.chunk_gaps_s]),
        "tpot_ms": spread(tpot),
        "e2e_ms": spread([o.e2e_s for o in done if o.e2e_s is not None]),
    }


def rate_text(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


# ----- the run -----


def run_rate(
    args: argparse.Namespace,
    name: str,
    url: str,
    rate: float | str,
    load: Sequence[Request],
    kind: str,
) -> dict[str, Any]:
    """``load`` on the server at ``url`` (rate ``SERIAL``: one request at a time); its
    figures, with the engine's steps where the server is slotwise."""
    label = rate if isinstance(rate, str) else f"{rate_text(rate)} requests/s"
    LOG.info("%s at %s: %d requests", name, label, len(load))
    model = served_model(url)
    before = step_totals(url) if kind == "slotwise" else None
    outcomes, duration = asyncio.run(
        run_load(
            url, model, load, IGNORE_EOS[kind], args.request_timeout, sequential=rate == SERIAL
        )
    )
    figures = summarise(rate, load, outcomes, duration)
    if before is not None:
        figures["engine_steps"] = engine_steps(before, step_totals(url), duration)
    if figures["failed"]:
        LOG.warning("%s: %d requests failed: %s", name, figures["failed"], figures["errors"])
    return figures


#: slotwise's step counters (``/metrics``) -> the key of each in ``step_totals``
STEP_METRICS = {
    "slotwise_engine_steps_total": "steps",
    "slotwise_engine_step_seconds_total": "seconds",
    "slotwise_engine_step_requests_total": "requests",
    "slotwise_engine_step_context_tokens_total": "context_tokens",
}


def step_totals(url: str) -> dict[str, dict[str, float]]:
    """slotwise's step counters now, by step kind (``decode``, ``mixed``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name not in STEP_METRICS:
            continue
        labels, _, value = rest.rpartition("} ")
        kind = labels.split('kind="', 1)[1].split('"', 1)[0]
        totals.setdefault(kind, {})[STEP_METRICS[name]] = float(value)
    return totals


def engine_steps(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], duration: float
) -> dict[str, Any]:
    """What slotwise's engine did between two ``step_totals``: per step kind the steps,
    mean requests and context tokens a request, mean step time; and the share of the
    run's ``duration`` spent in steps."""
    figures: dict[str, Any] = {}
    busy = 0.0
    for kind, totals in after.items():
        done = {key: value - before.get(kind, {}).get(key, 0.0) for key, value in totals.items()}
        steps = int(done.get("steps", 0))
        busy += done.get("seconds", 0.0)
        if steps == 0:
            continue
        requests = done.get("requests", 0.0)
        figures[kind] = {
            "steps": steps,
            "mean_requests": round(requests / steps, 2),
            "mean_context_tokens": round(done.get("context_tokens", 0.0) / requests, 1),
            "mean_step_ms": round(1000 * done.get("seconds", 0.0) / steps, 3),
        }
    figures["busy_fraction"] = round(busy / duration, 3) if duration else None
    return figures


def warm_up(
    args: argparse.Namespace, url: str, model: str, kind: str, words: Sequence[str]
) -> None:
    """``--warmup-requests`` concurrent requests, untimed, their prompt lengths spread over
    the load's range, so that compiles and first allocations for those sizes happen
    before the timed rates."""
    count = args.warmup_requests
    if count == 0:
        return
    low, high = length_range(args.input_len, args.range_ratio)
    sizes = [low + (high - low) * i // max(1, count - 1) for i in range(count)]
    rng = random.Random(args.seed + 1)
    requests = [
        Request(0.0, " ".join(rng.choice(words) for _ in range(size)), size, args.output_len)
        for size in sizes
    ]
    outcomes, _ = asyncio.run(run_load(url, model, requests, IGNORE_EOS[kind], 600))
    failed = [o.error for o in outcomes if o.error is not None]
    if failed:
        raise ServerError(f"warm-up requests failed: {failed[0]}")


def serial_load(load: Sequence[Request], count: int) -> list[Request]:
    """The first ``count`` requests of ``load`` (cycled if it has fewer), to send one
    after another."""
    return [dataclasses.replace(load[i % len(load)], arrival_s=0.0) for i in range(count)]


def prompt_words(model: Path | None) -> list[str]:
    """The words prompts are drawn from: within a written checkpoint's vocabulary (its
    config.json's ``vocab_size``), so each is one token there."""
    size = PROMPT_WORDS
    if model is not None:
        size = min(size, json.loads((model / "config.json").read_text())["vocab_size"])
    return vocabulary(size)


def token_counter(model: Path | None) -> TokenCount:
    """text -> token count with the checkpoint's tokenizer.json (no special tokens added:
    a server may add its BOS, which both then count alike)."""
    if model is None:
        return lambda text: len(text.split())
    import tokenizers

    backend = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    return lambda text: len(backend.encode(text, add_special_tokens=False).ids)


def measure_servers(
    args: argparse.Namespace, model: Path, loads: Sequence[Sequence[Request]], workdir: Path
) -> dict[str, Any]:
    """Start each server of ``--servers``, run every rate's load on each in alternating
    order, stop them; per server its command, start-up time and figures per rate."""
    words = prompt_words(model)
    results: dict[str, Any] = {}
    servers: dict[str, Server] = {}
    try:
        for name in args.servers:
            port = free_port()
            results[name] = {"runs": []}
            server = Server(name, [], port, workdir / f"{name}.log")
            try:
                extra = shlex.split(getattr(args, f"{name}_args"))
                server.command = results[name]["command"] = server_command(name, model, port, extra)
                server.start(args.startup_timeout)
                warm_up(args, server.url, served_model(server.url), name, words)
            except (ServerError, OSError) as error:
                server.stop()
                message = f"{name} could not be measured: {error}"
                tail = server.log_tail()
                if tail and tail not in message:
                    message += f"\n{tail}"
                LOG.error("%s", message)
                results[name]["error"] = message
                continue
            results[name]["startup_s"] = round(server.startup_s or 0.0, 2)
            results[name]["idle_cpu_s"] = 0.0
            servers[name] = server
        runs = list(zip(args.rates, loads, strict=True))
        if args.sequential:
            runs.append((SERIAL, serial_load(loads[0], args.sequential)))
        for index, (rate, load) in enumerate(runs):
            order = list(servers) if index % 2 == 0 else list(reversed(servers))
            for name in order:
                server = servers[name]
                others = [s for s in servers.values() if s is not server]
                idle_before = [s.cpu_seconds() or 0.0 for s in others]
                figures = run_rate(args, name, server.url, rate, load, name)
                results[name]["runs"].append(figures)
                for other, before in zip(others, idle_before, strict=True):
                    spent = (other.cpu_seconds() or 0.0) - before
                    results[other.name]["idle_cpu_s"] = round(
                        results[other.name]["idle_cpu_s"] + spent, 2
                    )
                if server.process is not None and server.process.poll() is not None:
                    message = f"{name} died during the load:\n{server.log_tail()}"
                    LOG.error("%s", message)
                    results[name]["error"] = message
                    results[name]["exit_code"] = server.process.returncode
                    del servers[name]
    finally:
        for name, server in servers.items():
            code = server.stop()
            results[name]["exit_code"] = code
            if code not in (0, None):
                LOG.warning("%s exited with %s after SIGTERM", name, code)
    return results


def saturation_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run of the highest output tokens/s among the request rates."""
    return max((r for r in runs if r["rate"] != SERIAL), key=lambda r: r["output_tokens_per_s"])


def measure_roofline(
    args: argparse.Namespace, model: Path, servers: dict[str, Any]
) -> dict[str, Any]:
    """slotwise's decode steps (from its ``/metrics``) against the memory roofline of
    ``slotwise bench`` (``bytes_per_step`` over ``measure_read_bandwidth``): at
    saturation, for the mean batch and context they ran; with one request in flight,
    the p50 ITL over the server's own decode step at batch 1."""
    import torch

    from slotwise.compilation.config import CompilationConfig
    from slotwise.platforms import get_current_platform
    from slotwise_engine.bench.decode import build_model, bytes_per_step, measure_read_bandwidth
    from slotwise_engine.runner.model_runner import ModelRunner

    runs = servers["slotwise"]["runs"]
    saturated = saturation_run(runs)
    decode = (saturated.get("engine_steps") or {}).get("decode")
    if decode is None:
        return {"error": f"slotwise ran no decode step at rate {saturated['rate']}"}
    batch = max(1, round(decode["mean_requests"]))
    context = max(1, round(decode["mean_context_tokens"]))
    dtype = args.dtype if args.model is None else model_dtype(model)
    # eager, and nothing runs: only the sizes of the weights and of the KV cache, which
    # the runner allocates (one block, as its element size is all that is read), count
    weights = build_model(
        str(model),
        dtype=getattr(torch, dtype),
        compilation_config=CompilationConfig(level=0),
    )
    ModelRunner(weights, num_blocks=1)
    step_bytes = bytes_per_step(weights, [context] * batch)
    probe = measure_read_bandwidth(step_bytes, device=get_current_platform().device_type)
    roofline_ms = 1000 * step_bytes / probe.bytes_per_second
    report: dict[str, Any] = {
        "dtype": dtype,
        "read_bandwidth_gb_s": round(probe.bytes_per_second / 1e9, 2),
        "saturation": {
            "rate": saturated["rate"],
            "decode_batch": decode["mean_requests"],
            "context_tokens": context,
            "bytes_per_step": step_bytes,
            "decode_step_ms": decode["mean_step_ms"],
            "roofline_ms": round(roofline_ms, 3),
            "roofline_fraction": round(roofline_ms / decode["mean_step_ms"], 3),
            "target": TARGET_ROOFLINE_FRACTION,
        },
    }
    serial = next((r for r in runs if r["rate"] == SERIAL), None)
    served = ((serial or {}).get("engine_steps") or {}).get("decode")
    if serial is not None and serial["itl_ms"] is not None and served is not None:
        report["serial"] = {
            "itl_p50_ms": serial["itl_ms"]["p50"],
            "tpot_p50_ms": serial["tpot_ms"]["p50"] if serial["tpot_ms"] else None,
            "decode_step_ms": served["mean_step_ms"],
            "itl_over_decode_step": round(serial["itl_ms"]["p50"] / served["mean_step_ms"], 3),
            "target": TARGET_SERIAL_ITL_RATIO,
        }
    return report


def model_dtype(model: Path) -> str:
    """The dtype a checkpoint's config.json names (float32 if none)."""
    config = json.loads((model / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def ratios(results: dict[str, Any]) -> dict[str, Any] | None:
    """slotwise over transformers per rate (throughput: higher is better for slotwise;
    latencies: lower is), and at saturation (each server's highest output tokens/s)."""
    mine, theirs = results.get("slotwise", {}), results.get("transformers", {})
    if not mine.get("runs") or not theirs.get("runs"):
        return None

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else round(a / b, 3)

    def p90(run: dict[str, Any], key: str) -> float | None:
        return run[key]["p90"] if run[key] else None

    per_rate = []
    # in the same order on both; one that died has fewer
    for a, b in zip(mine["runs"], theirs["runs"], strict=False):
        per_rate.append(
            {
                "rate": a["rate"],
                "output_tokens_per_s": ratio(a["output_tokens_per_s"], b["output_tokens_per_s"]),
                "ttft_p90": ratio(p90(a, "ttft_ms"), p90(b, "ttft_ms")),
                "itl_p90": ratio(p90(a, "itl_ms"), p90(b, "itl_ms")),
            }
        )
    best_mine = saturation_run(mine["runs"])["output_tokens_per_s"]
    best_theirs = saturation_run(theirs["runs"])["output_tokens_per_s"]
    saturation = ratio(best_mine, best_theirs)
    latencies_ok = all(
        row[key] is not None and row[key] <= 1.0
        for row in per_rate
        for key in ("ttft_p90", "itl_p90")
    )
    return {
        "per_rate": per_rate,
        "saturation_output_tokens_per_s": saturation,
        "target_saturation_ratio": TARGET_THROUGHPUT_RATIO,
        "saturation_met": saturation is not None and saturation >= TARGET_THROUGHPUT_RATIO,
        "latencies_met": latencies_ok,
    }


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    settings = {
        "rates": [rate_text(rate) for rate in args.rates],
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "range_ratio": args.range_ratio,
        "seed": args.seed,
        "warmup_requests": args.warmup_requests,
        "sequential": args.sequential,
    }
    report: dict[str, Any] = {
        "benchmark": "serving",
        "timestamp": utc_timestamp(),
        "environment": {**environment(), "transformers_version": package_version("transformers")},
        "settings": settings,
    }
    with tempfile.TemporaryDirectory(prefix="slotwise-serving-") as tmp:
        workdir = Path(tmp)
        model = args.model
        if model is None and args.url is None:
            model = write_checkpoint(workdir / "model", args.preset, args.dtype, args.seed)
            settings["model"] = f"preset {args.preset}, {args.dtype} (random weights)"
        elif model is not None:
            settings["model"] = str(model)
        words, count = prompt_words(model), token_counter(model)
        loads = [build_load(args, rate, words, count) for rate in args.rates]
        if args.url is not None:
            settings["url"] = args.url
            settings["url_kind"] = args.url_kind
            warm_up(args, args.url, served_model(args.url), args.url_kind, words)
            runs = [
                run_rate(args, args.url, args.url, rate, load, args.url_kind)
                for rate, load in zip(args.rates, loads, strict=True)
            ]
            if args.sequential:
                serial = serial_load(loads[0], args.sequential)
                runs.append(run_rate(args, args.url, args.url, SERIAL, serial, args.url_kind))
            report["servers"] = {"url": {"url": args.url, "runs": runs}}
        else:
            report["servers"] = measure_servers(args, model, loads, workdir)
            report["ratios"] = ratios(report["servers"])
            if args.roofline and report["servers"].get("slotwise", {}).get("runs"):
                report["roofline"] = measure_roofline(args, model, report["servers"])
        settings["prompt_tokens_mean"] = round(
            sum(r.prompt_tokens for r in loads[0]) / len(loads[0]), 1
        )
        settings["output_tokens_requested"] = sum(r.max_tokens for r in loads[0])
    return report


# ----- the outputs -----


def fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def render_markdown(report: dict[str, Any]) -> str:
    settings = report["settings"]
    lines = [
        f"# Serving under load ({report['timestamp']})",
        "",
        f"Model: {settings.get('model', settings.get('url'))}; {settings['num_prompts']} "
        f"requests a rate, prompts of {settings['prompt_tokens_mean']} tokens on average "
        f"(±{settings['range_ratio']:.0%} of {settings['input_len']}), outputs of ±"
        f"{settings['range_ratio']:.0%} of {settings['output_len']} tokens, seed "
        f"{settings['seed']}. Latencies in ms (p50 / p90 / p99).",
        "",
        "| server | rate (req/s) | done | req/s | output tok/s | TTFT | ITL | TPOT | e2e |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in report["servers"].items():
        for run in result["runs"]:
            cells = [
                name,
                run["rate"],
                f"{run['completed']}/{run['completed'] + run['failed']}",
                fmt(run["requests_per_s"]),
                fmt(run["output_tokens_per_s"]),
                *(three(run[key]) for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        if "error" in result:
            lines.append(f"| {name} | {result['error'].splitlines()[0]} | | | | | | | |")
    lines.append("")
    for name, result in report["servers"].items():
        if "startup_s" in result:
            lines.append(
                f"- {name}: ready after {result['startup_s']} s; idle CPU while the other "
                f"ran: {result['idle_cpu_s']} s; exit code after SIGTERM: {result['exit_code']}; "
                f"output lengths exact: {all(r['output_lengths_exact'] for r in result['runs'])}"
            )
    summary = report.get("ratios")
    missing = [name for name, result in report["servers"].items() if not result["runs"]]
    if missing:
        lines += ["", f"No ratios: {', '.join(missing)} not measured (see above)."]
    if summary is not None:
        lines += [
            "",
            "slotwise ÷ transformers (throughput: above 1 is better; latencies: below 1 is):",
            "",
            "| rate (req/s) | output tok/s | p90 TTFT | p90 ITL |",
            "|---:|---:|---:|---:|",
        ]
        for row in summary["per_rate"]:
            lines.append(
                f"| {row['rate']} | {fmt(row['output_tokens_per_s'])} | "
                f"{fmt(row['ttft_p90'])} | {fmt(row['itl_p90'])} |"
            )
        lines += [
            "",
            f"- saturation output tokens/s {fmt(summary['saturation_output_tokens_per_s'])}x "
            f"(target {TARGET_THROUGHPUT_RATIO}x): {verdict(summary['saturation_met'])}",
            f"- p90 TTFT and ITL no worse at every rate: {verdict(summary['latencies_met'])}",
        ]
    lines += render_engine_steps(report)
    return "\n".join(lines) + "\n"


def render_engine_steps(report: dict[str, Any]) -> list[str]:
    """slotwise's steps per run, and the engine's decode step against them."""
    runs = [r for r in report["servers"].get("slotwise", {}).get("runs", []) if "engine_steps" in r]
    if not runs:
        return []
    lines = [
        "",
        "slotwise's engine steps (from /metrics): decode steps, mean requests in one, mean "
        "context tokens a request, mean step ms; mixed steps alike; share of the wall time "
        "in steps:",
        "",
        "| rate (req/s) | decode steps | requests | context | step ms | mixed steps | requests "
        "| step ms | busy |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        steps = run["engine_steps"]
        cells = [run["rate"]]
        for kind, keys in (
            ("decode", ("steps", "mean_requests", "mean_context_tokens", "mean_step_ms")),
            ("mixed", ("steps", "mean_requests", "mean_step_ms")),
        ):
            figures = steps.get(kind)
            cells += [fmt(figures[key]) if figures else "0" for key in keys]
        cells.append(fmt(steps["busy_fraction"]))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    roofline = report.get("roofline")
    if roofline is None:
        return lines
    if "error" in roofline:
        return [*lines, "", f"No roofline: {roofline['error']}"]
    saturation = roofline["saturation"]
    fraction = saturation["roofline_fraction"]
    lines += [
        "",
        f"- saturation (rate {saturation['rate']}): decode steps of "
        f"{saturation['decode_batch']} requests ({saturation['context_tokens']} tokens of "
        f"context each) take {saturation['decode_step_ms']} ms; reading "
        f"{saturation['bytes_per_step'] / 1e6:.1f} MB at {roofline['read_bandwidth_gb_s']} GB/s "
        f"takes {saturation['roofline_ms']} ms: {fraction} of the memory roofline (target "
        f"{TARGET_ROOFLINE_FRACTION}): {verdict(fraction >= TARGET_ROOFLINE_FRACTION)}",
    ]
    serial = roofline.get("serial")
    if serial is not None:
        ratio = serial["itl_over_decode_step"]
        lines.append(
            f"- one request in flight: p50 ITL {serial['itl_p50_ms']} ms (p50 TPOT "
            f"{fmt(serial['tpot_p50_ms'])} ms), the server's decode step at batch 1 "
            f"{serial['decode_step_ms']} ms (mean): {ratio}x (target at most "
            f"{TARGET_SERIAL_ITL_RATIO}x): {verdict(ratio <= TARGET_SERIAL_ITL_RATIO)}"
        )
    return lines


def three(spread_ms: dict[str, float] | None) -> str:
    if spread_ms is None:
        return "n/a"
    return " / ".join(f"{spread_ms[f'p{p}']:.1f}" for p in PERCENTILES)


def plot(report: dict[str, Any], path: Path) -> bool:
    """Output tokens/s and p90 TTFT and ITL against the request rate, one line a server;
    False (with one warning) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        LOG.warning("matplotlib is not installed: no %s (pip install matplotlib)", path.name)
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot

    rates = report["settings"]["rates"]
    figure, axes = pyplot.subplots(1, 3, figsize=(13, 3.8))
    panels = (
        ("output_tokens_per_s", None, "output tokens/s"),
        ("ttft_ms", "p90", "p90 time to first token (ms)"),
        ("itl_ms", "p90", "p90 inter-token latency (ms)"),
    )
    for axis, (key, sub, title) in zip(axes, panels, strict=True):
        for name, result in report["servers"].items():
            runs = [r for r in result.get("runs") or [] if r["rate"] != SERIAL]
            points = [
                (i, run[key] if sub is None else (run[key] or {}).get(sub))
                for i, run in enumerate(runs)
            ]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", label=name)
        axis.set_xticks(range(len(rates)), rates)
        axis.set_xlabel("request rate (requests/s)")
        axis.set_title(title)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(report["settings"].get("model", "serving"), fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    LOG.info("wrote %s", path)
    return True


# ----- the command line -----


def rate_list(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part]
    except ValueError:
        rates = []
    if not rates or any(rate <= 0 or math.isnan(rate) for rate in rates):
        raise argparse.ArgumentTypeError(
            f"{text!r}: use a comma-separated list of requests/s above 0, or inf"
        )
    return rates


def server_list(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(SERVERS))
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: use a comma-separated list of distinct {', '.join(SERVERS)}"
        )
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=rate_list, default=[0.5, 1, 2, 4, math.inf])
    parser.add_argument("--num-prompts", type=int, default=64, help="requests at each rate")
    parser.add_argument("--input-len", type=int, default=128, help="mean prompt tokens")
    parser.add_argument("--output-len", type=int, default=64, help="mean output tokens")
    parser.add_argument(
        "--range-ratio", type=float, default=0.5, help="lengths uniform within this of the mean"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--servers", type=server_list, default=list(SERVERS), help="comma-separated"
    )
    parser.add_argument("--preset", choices=("tiny", "small", "1b"), default="small")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument(
        "--model",
        type=Path,
        help="a checkpoint folder instead of a preset (with --url: the tokenizer that "
        "measures the prompts; without, prompts are counted in words)",
    )
    parser.add_argument("--url", help="drive this running server (http://host:port) alone")
    parser.add_argument(
        "--url-kind",
        choices=("slotwise", "transformers", "other"),
        default="other",
        help="how --url's server is told to ignore end-of-sequence (other: not told)",
    )
    for name in SERVERS:
        parser.add_argument(
            f"--{name}-args",
            default="",
            help=f"more options of the {name} server's command line, as one string "
            f"(--{name}-args='--flag value')",
        )
    parser.add_argument(
        "--sequential",
        type=int,
        default=0,
        metavar="N",
        help="also send N requests one after another (one in flight), rate 'serial'",
    )
    parser.add_argument(
        "--roofline",
        action="store_true",
        help="set slotwise's decode steps at saturation against the memory roofline, and "
        "its serial ITL against its own decode step",
    )
    parser.add_argument("--warmup-requests", type=int, default=4)
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--png", type=Path, help="the plot's path (default: <out-dir>/serving.png)")
    add_output_args(parser)
    args = parser.parse_args(argv)
    require_positive(parser, args, "num_prompts", "input_len", "output_len")
    if not 0 <= args.range_ratio < 1:
        parser.error("--range-ratio must be at least 0 and below 1")
    if args.warmup_requests < 0:
        parser.error("--warmup-requests must be at least 0")
    if args.sequential < 0:
        parser.error("--sequential must be at least 0")
    if args.roofline and (args.url is not None or "slotwise" not in args.servers):
        parser.error("--roofline reads slotwise's steps and checkpoint: run slotwise (no --url)")
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there; pass a checkpoint folder")
    return args


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    # the client's one line a request
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse_args(argv)
    report = build_report(args)
    png = args.png or args.out_dir / "serving.png"
    report["plot"] = str(png) if plot(report, png) else None
    publish("serving", report, render_markdown(report), args)
    measured = [r for r in report["servers"].values() if r.get("runs")]
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
