"""Measure what slotwise's level-3 dispatch costs per forward on a model of tiny tensors.

Why: with tensors this small every forward is pure Python and dispatcher overhead, so
this model shows what piecewise compilation adds around the kernels: the Dynamo entry,
the split graph, the piecewise backends and the eagerly run splitting ops between them.
Level 3 also removes something: Dynamo flattens the ``nn.Module`` tree into one graph, so
the per-module ``__call__`` machinery of eager PyTorch is gone.  The target is that the
second pays for the first: level 3 with the eager backend and graph mode ``NONE`` is at
most 1.0x the plain eager module.

The model has ``--layers`` (32) layers; each calls the toy attention op ``attend`` (a
splitting op) and then a ``nn.Linear``, a ReLU and a residual add, on ``--batch`` x
``--hidden`` (4 x 8) tensors.  At level 3 that gives 2L+1 pieces, L+1 of them compiled
with the eager compiler.  Three variants of the same weights are timed:

* ``eager``: level 0, the plain module (the baseline);
* ``level3``: level 3, ``backend="eager"``, ``graph_mode="NONE"``, split at ``attend``;
* ``level3_nosplit``: the same with ``splitting_ops=[]`` (one piece), for context.

Each variant is built and called once (which compiles it), checked against the eager
output, warmed up, then timed in ``--rounds`` rounds; a round times ``--calls`` forwards
of every variant, in an order rotated each round, so that noise on this shared machine
hits all variants alike.  The reported numbers are medians over rounds; the ratio is
taken within this one run.  Everything runs under ``torch.no_grad()`` with one intra-op
thread (``--threads``).  ``--profile`` adds a cProfile of the level-3 forward.

Results go to ``<out-dir>/dispatch_overhead.json`` and ``.md`` (and, with ``--profile``,
``dispatch_overhead_profile.txt``); the Markdown (or the JSON with ``--json``) is printed.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from common import (
    LOG,
    add_output_args,
    configure_logging,
    environment,
    publish,
    require_positive,
    summary,
    utc_timestamp,
    verdict,
)
from torch import nn

from slotwise.compilation import CompilationConfig, counters, support_torch_compile
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, attend

TARGET_RATIO = 1.0
DEFAULT_LAYERS = 32
DEFAULT_HIDDEN = 8
DEFAULT_BATCH = 4
DEFAULT_ROUNDS = 100
DEFAULT_CALLS = 20
WARMUP_CALLS = 50
PROFILE_CALLS = 200
PROFILE_TOP = 25
BASELINE = "eager"
SUBJECT = "level3"


class TinyLayer(nn.Module):
    """One split point (``attend``), then a linear layer, a ReLU and a residual add."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = attend(x, x, x)
        return x + torch.relu(self.proj(mixed))


@support_torch_compile
class TinyModel(nn.Module):
    """``num_layers`` tiny layers: 2L+1 pieces at level 3, L+1 of them compiled."""

    def __init__(self, num_layers: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TinyLayer(hidden) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@dataclass(frozen=True)
class Variant:
    """One way of running the model."""

    name: str
    description: str
    config: dict[str, Any]


VARIANTS = (
    Variant(BASELINE, "level 0 (plain module)", {"level": 0}),
    Variant(
        SUBJECT,
        "level 3, eager backend, graph mode NONE, split at attend",
        {
            "level": 3,
            "backend": "eager",
            "graph_mode": "NONE",
            "splitting_ops": TOY_SPLITTING_OPS,
            "disable_cache": True,
        },
    ),
    Variant(
        "level3_nosplit",
        "level 3, eager backend, graph mode NONE, splitting_ops=[]",
        {
            "level": 3,
            "backend": "eager",
            "graph_mode": "NONE",
            "splitting_ops": [],
            "disable_cache": True,
        },
    ),
)


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that changed, with their increments."""
    return {name: after[name] - before[name] for name in after if after[name] != before[name]}


def build_models(
    args: argparse.Namespace, x: torch.Tensor
) -> tuple[dict[str, nn.Module], dict[str, dict[str, int]]]:
    """One model per variant, all with the baseline's weights, each called once (which
    compiles it) and checked against the baseline's output; also the counter increments
    of each first call."""
    torch.manual_seed(0)
    models: dict[str, nn.Module] = {}
    compiled: dict[str, dict[str, int]] = {}
    reference: torch.Tensor | None = None
    state: dict[str, torch.Tensor] | None = None
    for variant in VARIANTS:
        LOG.info("building %s: %s", variant.name, variant.description)
        config = CompilationConfig(**variant.config)
        model = TinyModel(args.layers, args.hidden, compilation_config=config).eval()
        if state is None:
            state = model.state_dict()
        else:
            model.load_state_dict(state)
        before = counters.snapshot()
        with torch.no_grad():
            out = model(x)
        compiled[variant.name] = counter_delta(before, counters.snapshot())
        if reference is None:
            reference = out
        elif not torch.allclose(out, reference, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"variant {variant.name} disagrees with {BASELINE}")
        models[variant.name] = model
    return models, compiled


def time_calls(model: nn.Module, x: torch.Tensor, calls: int) -> float:
    """Mean wall time of one forward over ``calls`` forwards, in microseconds."""
    start = time.perf_counter()
    for _ in range(calls):
        model(x)
    return (time.perf_counter() - start) / calls * 1e6


def measure(
    models: dict[str, nn.Module], x: torch.Tensor, rounds: int, calls: int
) -> dict[str, list[float]]:
    """Warm up, then ``rounds`` rounds of ``calls`` forwards per variant, order rotated."""
    names = list(models)
    samples: dict[str, list[float]] = {name: [] for name in names}
    with torch.no_grad():
        LOG.info("warming up (%d forwards per variant)", WARMUP_CALLS)
        for name in names:
            time_calls(models[name], x, WARMUP_CALLS)
        for i in range(rounds):
            if (i + 1) % 10 == 0 or i == 0:
                LOG.info("round %d/%d", i + 1, rounds)
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(time_calls(models[name], x, calls))
    return samples


def profile_forward(model: nn.Module, x: torch.Tensor, calls: int) -> tuple[str, list[dict]]:
    """cProfile ``calls`` forwards; the text report and the top functions by own time."""
    profiler = cProfile.Profile()
    with torch.no_grad():
        profiler.enable()
        for _ in range(calls):
            model(x)
        profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(PROFILE_TOP)
    stats.sort_stats("cumulative").print_stats(PROFILE_TOP)
    rows = []
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    ranked = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:PROFILE_TOP]
    for (filename, line, function), (_, ncalls, tottime, cumtime, _) in ranked:
        rows.append(
            {
                "function": f"{filename}:{line}({function})",
                "calls_per_forward": round(ncalls / calls, 2),
                "own_us_per_forward": round(tottime / calls * 1e6, 1),
                "cumulative_us_per_forward": round(cumtime / calls * 1e6, 1),
            }
        )
    return stream.getvalue(), rows


def build_report(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """Run the measurement; the report and, with ``--profile``, the profiler's text."""
    torch.set_num_threads(args.threads)
    x = torch.randn(args.batch, args.hidden)
    models, compiled = build_models(args, x)
    samples = measure(models, x, args.rounds, args.calls)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    base = medians[BASELINE]
    paired = {
        name: round(
            statistics.median(v / b for v, b in zip(values, samples[BASELINE], strict=True)), 3
        )
        for name, values in samples.items()
    }
    ratio = round(medians[SUBJECT] / base, 3)
    report: dict[str, Any] = {
        **environment(),
        "torch_threads": torch.get_num_threads(),
        "model": {"layers": args.layers, "hidden": args.hidden, "batch": args.batch},
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "warmup_calls": WARMUP_CALLS,
        "variants": {
            v.name: {
                "description": v.description,
                "config": v.config,
                "first_call_counters": compiled[v.name],
                "us_per_forward": summary(samples[v.name], 1),
                "ratio_to_eager": round(medians[v.name] / base, 3),
                "paired_ratio_to_eager": paired[v.name],
            }
            for v in VARIANTS
        },
        "ratio": ratio,
        "overhead_us_per_split_point": round((medians[SUBJECT] - base) / args.layers, 2),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "timestamp": utc_timestamp(),
    }
    profile_text = None
    if args.profile:
        LOG.info("profiling %d forwards of %s", PROFILE_CALLS, SUBJECT)
        profile_text, rows = profile_forward(models[SUBJECT], x, PROFILE_CALLS)
        report["profile_top_by_own_time"] = rows
    return report, profile_text


def render_markdown(report: dict[str, Any]) -> str:
    """A Markdown table of the variants, followed by the verdict lines."""
    lines = [
        "| variant | what | median (µs/forward) | min | p90 | vs eager | paired |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, v in report["variants"].items():
        t = v["us_per_forward"]
        lines.append(
            f"| `{name}` | {v['description']} | {t['median']:.1f} | {t['min']:.1f} "
            f"| {t['p90']:.1f} | {v['ratio_to_eager']:.3f}x | {v['paired_ratio_to_eager']:.3f}x |"
        )
    subject = report["variants"][SUBJECT]["first_call_counters"]
    model = report["model"]
    lines += [
        "",
        f"level 3 / eager (ratio of medians): {report['ratio']:.3f}x "
        f"(target <= {report['target_ratio']:.1f}x): **{verdict(report['meets_target'])}**",
        f"level 3 minus eager, per split point: {report['overhead_us_per_split_point']:.2f} µs",
        f"level 3 pieces: {subject.get('num_piecewise_graphs_seen', 0)}, compiled: "
        f"{subject.get('num_piecewise_capturable_graphs_seen', 0)} "
        f"(eager compiles {subject.get('num_eager_compiles', 0)}, "
        f"in-memory reuses {subject.get('num_cache_hits', 0)})",
        f"model: {model['layers']} layers, hidden {model['hidden']}, batch {model['batch']}; "
        f"{report['rounds']} rounds x {report['calls_per_round']} forwards, "
        f"{report['torch_threads']} thread(s); python {report['python_version']}, "
        f"torch {report['torch_version']}",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="layers (split points)")
    parser.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN, help="hidden size")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="rows of the input")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed rounds")
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help="forwards per round")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--profile", action="store_true", help="also cProfile the level-3 model")
    add_output_args(parser)
    args = parser.parse_args(argv)
    require_positive(parser, args, "layers", "hidden", "batch", "rounds", "calls", "threads")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    configure_logging()
    args = parse_args(argv)
    report, profile_text = build_report(args)
    publish("dispatch_overhead", report, render_markdown(report), args, profile_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
