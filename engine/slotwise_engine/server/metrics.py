"""The server's metrics in Prometheus' text exposition format (version 0.0.4), written
here rather than through prometheus_client: three metric kinds, and one registry the
``/metrics`` route renders.

Names follow vLLM's where it has one, with the ``slotwise_`` prefix; every sample has
a ``model_name`` label.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

#: Buckets of the latency histograms, in seconds: from a fast decode step to a long
#: request on a slow machine.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _labels(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels) + "}"


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: dict[str, str]) -> None:
        self.name = name
        self.help = help
        self.labels = tuple(labels.items())

    def header(self) -> list[str]:
        text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        return [f"# HELP {self.name} {text}", f"# TYPE {self.name} {self.kind}"]

    def lines(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    """A count that only grows; one sample per value of its extra label (if any)."""

    kind = "counter"

    def __init__(
        self, name: str, help: str, labels: dict[str, str], *, by: str | None = None
    ) -> None:
        super().__init__(name, help, labels)
        self.by = by
        self.values: dict[str, float] = {} if by else {"": 0.0}

    def inc(self, amount: float = 1.0, *, key: str = "") -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot decrease (by {amount})")
        self.values[key] = self.values.get(key, 0.0) + amount

    def set_total(self, total: float, *, key: str = "") -> None:
        """Follow a count kept elsewhere (the engine's preemptions)."""
        self.values[key] = float(total)

    def lines(self) -> list[str]:
        return [
            f"{self.name}{_labels(self.labels + (((self.by, key),) if self.by else ()))} "
            f"{_number(value)}"
            for key, value in sorted(self.values.items())
        ]


class Gauge(_Metric):
    """A value that goes up and down, set when the metrics are rendered."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labels: dict[str, str]) -> None:
        super().__init__(name, help, labels)
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def lines(self) -> list[str]:
        return [f"{self.name}{_labels(self.labels)} {_number(self.value)}"]


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labels: dict[str, str],
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help, labels)
        if list(buckets) != sorted(set(buckets)):
            raise ValueError(f"{self.name}: buckets must increase strictly, got {buckets}")
        self.bounds = (*buckets, math.inf)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def lines(self) -> list[str]:
        lines = []
        cumulative = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            le = (("le", _number(bound)),)
            lines.append(f"{self.name}_bucket{_labels(self.labels + le)} {cumulative}")
        lines.append(f"{self.name}_sum{_labels(self.labels)} {_number(self.sum)}")
        lines.append(f"{self.name}_count{_labels(self.labels)} {cumulative}")
        return lines


def exposition(metrics: Iterable[_Metric]) -> str:
    """The text format of ``metrics``: each one's HELP and TYPE, then its samples."""
    lines = []
    for metric in metrics:
        lines += metric.header() + metric.lines()
    return "\n".join(lines) + "\n"


#: The content type of the text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineLoad(Protocol):
    """What the gauges read from the engine (its ``stats()``)."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    num_preemptions: int
    #: per step kind: an object with ``steps``, ``seconds``, ``requests`` and
    #: ``context_tokens`` (the engine's ``StepTotals``)
    step_totals: Mapping[str, Any]


class ServerMetrics:
    """Every metric of the server; routes report each request through :meth:`track`."""

    def __init__(self, model_name: str) -> None:
        labels = {"model_name": model_name}
        self.running = Gauge(
            "slotwise_num_requests_running", "Requests in the engine's running batch.", labels
        )
        self.waiting = Gauge(
            "slotwise_num_requests_waiting", "Requests waiting to be scheduled.", labels
        )
        self.kv_usage = Gauge(
            "slotwise_kv_cache_usage",
            "Fraction of the KV cache's blocks in use (0 to 1).",
            labels,
        )
        self.preemptions = Counter(
            "slotwise_num_preemptions_total",
            "Running requests preempted (their KV blocks freed, recomputed later).",
            labels,
        )
        self.prompt_tokens = Counter(
            "slotwise_prompt_tokens_total", "Prompt tokens of the requests admitted.", labels
        )
        self.generation_tokens = Counter(
            "slotwise_generation_tokens_total", "Tokens generated.", labels
        )
        self.finished = Counter(
            "slotwise_requests_finished_total",
            "Requests finished, by reason: stop (end-of-sequence or a stop), length "
            "(max_tokens or the context), abort (client gone or shutdown), error (a failed step).",
            labels,
            by="finished_reason",
        )
        self.ttft = Histogram(
            "slotwise_time_to_first_token_seconds",
            "From a request's arrival to its first generated token.",
            labels,
        )
        self.itl = Histogram(
            "slotwise_inter_token_latency_seconds",
            "Between two successive outputs of a request, per token they bring.",
            labels,
        )
        self.e2e = Histogram(
            "slotwise_e2e_request_latency_seconds",
            "From a request's arrival to its end.",
            labels,
        )
        #: The engine's steps by kind: "decode" (every request computes one token) or
        #: "mixed" (prompt chunks too); what a benchmark divides to get batch sizes and
        #: step times.
        self.steps = Counter(
            "slotwise_engine_steps_total",
            "Engine steps run, by kind: decode (one token for each request) or mixed "
            "(prompt chunks too).",
            labels,
            by="kind",
        )
        self.step_seconds = Counter(
            "slotwise_engine_step_seconds_total",
            "Wall time in engine steps (scheduling, the model, sampling, detokenizing), by kind.",
            labels,
            by="kind",
        )
        self.step_requests = Counter(
            "slotwise_engine_step_requests_total",
            "Requests in engine steps, summed over the steps, by kind.",
            labels,
            by="kind",
        )
        self.step_context_tokens = Counter(
            "slotwise_engine_step_context_tokens_total",
            "Tokens whose keys and values the steps' requests attend to, summed over the "
            "requests and steps, by kind.",
            labels,
            by="kind",
        )

    def render(self, load: EngineLoad) -> str:
        """The exposition, with the gauges read from ``load`` now."""
        self.running.set(load.num_running)
        self.waiting.set(load.num_waiting)
        total = load.kv_blocks_total
        self.kv_usage.set(load.kv_blocks_used / total if total else 0.0)
        self.preemptions.set_total(load.num_preemptions)
        for kind, totals in load.step_totals.items():
            self.steps.set_total(totals.steps, key=kind)
            self.step_seconds.set_total(totals.seconds, key=kind)
            self.step_requests.set_total(totals.requests, key=kind)
            self.step_context_tokens.set_total(totals.context_tokens, key=kind)
        return exposition(
            [
                self.running,
                self.waiting,
                self.kv_usage,
                self.preemptions,
                self.prompt_tokens,
                self.generation_tokens,
                self.finished,
                self.ttft,
                self.itl,
                self.e2e,
                self.steps,
                self.step_seconds,
                self.step_requests,
                self.step_context_tokens,
            ]
        )

    def track(self, arrival: float | None = None) -> RequestTimer:
        """A timer for one request arriving now (``time.monotonic()``) or at ``arrival``."""
        return RequestTimer(self, time.monotonic() if arrival is None else arrival)


class RequestTimer:
    """One request's contribution to the metrics, fed with each output as it comes and
    closed once, whether it finished or its client went away."""

    def __init__(self, metrics: ServerMetrics, arrival: float) -> None:
        self.metrics = metrics
        self.arrival = arrival
        self.last_token_time: float | None = None
        self.prompt_counted = False
        self.closed = False

    def admitted(self, prompt_tokens: int) -> None:
        """The engine took the request (its first output came)."""
        if not self.prompt_counted:
            self.metrics.prompt_tokens.inc(prompt_tokens)
            self.prompt_counted = True

    def tokens(self, count: int, now: float | None = None) -> None:
        """``count`` new tokens arrived at ``now``."""
        if count <= 0:
            return
        now = time.monotonic() if now is None else now
        if self.last_token_time is None:
            self.metrics.ttft.observe(now - self.arrival)
        else:
            gap = (now - self.last_token_time) / count
            for _ in range(count):
                self.metrics.itl.observe(gap)
        self.last_token_time = now
        self.metrics.generation_tokens.inc(count)

    def close(self, finish_reason: str, now: float | None = None) -> None:
        """The request ended with ``finish_reason``; later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        now = time.monotonic() if now is None else now
        self.metrics.finished.inc(key=finish_reason)
        self.metrics.e2e.observe(now - self.arrival)
