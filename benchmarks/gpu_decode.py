"""Decode-step latency on an NVIDIA GPU: eager, piecewise and full CUDA graphs, torch.compile.

Run by tests/gpu/run_gpu_checks.sh on a machine with a GPU, on the ``small`` preset
and on ``1b`` (Llama-3.2-1B's shapes).  "Full graphs" is FULL_AND_PIECEWISE:
decode steps, the ones timed here, replay one graph of the whole model.  Every row is
set against the memory roofline (``bytes_per_step`` over a device-memory read probe
measured before the first timed step, with CUDA events on a GPU), and the report names
the graph mode a config without one gets and why.  The notes set the run against the
targets of issue 42: the default mode within 5% of full graphs at batch 1; piecewise at
most 1.25x full graphs on ``small`` and 1.10x on the 1B preset; full graphs at least
0.6 of the roofline on the 1B preset at batch 1; every graph variant faster than
reduce-overhead at every batch size.  It runs on any platform with static graphs, so
the script can be tried on the CPU first with ``SLOTWISE_PLATFORM=ascend_stub``
(simulated graphs; the timings mean nothing there).

The rows above time the model's step alone (``ModelRunner.execute`` on inputs built
before the timing, then the logits).  ``whole_steps`` times each variant's decode step
as ``generate`` makes it, through ``ModelRunner.step``: the runner's inputs and
attention metadata, the model, the logits and the greedy sampler, until the tokens are
on the host.  Its difference to the model's step is the host work around the model.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from common import add_output_args, configure_logging, publish, verdict

from slotwise.compilation.config import CompilationConfig
from slotwise.platforms import current_platform
from slotwise.stats import interleaved_timings, percentile
from slotwise_engine.bench.decode import VariantSetup, run_benchmark
from slotwise_engine.runner.model_runner import ModelRunner, Request
from slotwise_engine.runner.sampling import Sampler, SamplingParams

LOG = logging.getLogger("slotwise.benchmarks")

DEFAULT_VARIANTS = "eager,level3+graphs,level3+full_graphs,torch.compile:reduce-overhead"
PIECEWISE = "level3+graphs"
FULL = "level3+full_graphs"
REDUCE_OVERHEAD = "torch.compile:reduce-overhead"
#: The most a piecewise step may take, as a multiple of a full-graph step, at batch 1.
PIECEWISE_VS_FULL_TARGETS = {"small": 1.25, "1b": 1.10}
#: The least fraction of the memory roofline a full-graph step reaches at batch 1.
FULL_ROOFLINE_TARGETS = {"1b": 0.6}
#: The most the default graph mode's step may exceed a full-graph step, at batch 1.
DEFAULT_VS_FULL_TARGET = 0.05
PROMPT_LEN = 32
WARMUPS = 5


@dataclass
class WholeStep:
    """One decode step as ``generate`` makes it: ``ModelRunner.step`` and the greedy
    sampler, until the tokens are on the host.  Each call decodes the same position
    again (the request takes its step back afterwards, outside the timing), so the
    requests never outgrow the blocks the benchmark's runners hold."""

    runner: ModelRunner
    requests: list[Request]
    sampler: Sampler

    @classmethod
    def prepare(cls, runner: ModelRunner, batch: int) -> WholeStep:
        """``batch`` prompts prefilled, each with the token its decode step reads."""
        generator = torch.Generator().manual_seed(batch)
        prompts = torch.randint(0, runner.model.config.vocab_size, (batch, PROMPT_LEN))
        requests = runner.add_requests(prompts.tolist(), max_new_tokens=1)
        runner.step(requests)
        for request in requests:
            request.tokens.append(int(torch.randint(0, 100, (1,), generator=generator)))
        return cls(runner, requests, Sampler([SamplingParams()] * batch, runner.device))

    def timed(self) -> float:
        start = time.perf_counter()
        self.sampler(self.runner.step(self.requests)).tolist()
        self.runner.platform.synchronize()
        seconds = time.perf_counter() - start
        for request in self.requests:
            request.num_cached -= 1
        return seconds


def time_whole_steps(
    setups: Sequence[VariantSetup], batch_sizes: Sequence[int], iterations: int
) -> list[dict[str, Any]]:
    """Each variant's whole decode step at each batch size, variants interleaved."""
    rows = []
    for batch in batch_sizes:
        steps = {setup.name: WholeStep.prepare(setup.runner, batch) for setup in setups}
        timers = {name: step.timed for name, step in steps.items()}
        samples = interleaved_timings(timers, iterations, warmups=WARMUPS)
        for name, step in steps.items():
            step.runner.free(step.requests)
            rows.append(
                {
                    "variant": name,
                    "batch_size": batch,
                    "p50_ms": statistics.median(samples[name]) * 1e3,
                    "p90_ms": percentile(samples[name], 90) * 1e3,
                }
            )
    return rows


def with_model_steps(whole: list[dict[str, Any]], result: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole steps beside the model's step alone (the run's rows) and the host
    work between them."""
    execute = {(m["variant"], m["batch_size"]): m["p50_ms"] for m in result["measurements"]}
    rows = []
    for row in whole:
        model_ms = execute[(row["variant"], row["batch_size"])]
        rows.append(
            {**row, "execute_p50_ms": model_ms, "around_model_ms": row["p50_ms"] - model_ms}
        )
    return rows


def target_notes(result: dict[str, Any], num_sizes: int) -> list[str]:
    """The issue's targets, each with the value this run measured."""
    rows = {(m["variant"], m["batch_size"]): m for m in result["measurements"]}
    preset = result["preset"]
    piecewise, full = rows.get((PIECEWISE, 1)), rows.get((FULL, 1))
    default = result["default_graph_mode"]
    notes = [f"default graph mode {default['mode']} ({default['variant']}): {default['reason']}"]
    if piecewise is not None:
        notes.append(f"piecewise vs eager at batch 1: {piecewise['speedup_vs_eager']:.2f}x")
        capture_ms = piecewise["capture_seconds"] / num_sizes * 1e3
        notes.append(f"piecewise capture per size: {capture_ms:.1f} ms")
    if full is not None:
        capture_ms = full["capture_seconds"] / num_sizes * 1e3
        notes.append(f"full graphs capture per size: {capture_ms:.1f} ms")
        defaulted = rows.get((default["variant"], 1))
        if defaulted is not None:
            slower = defaulted["p50_ms"] / full["p50_ms"] - 1
            notes.append(
                f"default mode vs full graphs at batch 1: {slower * 100:+.1f}% step time "
                f"(target <= +{DEFAULT_VS_FULL_TARGET * 100:.0f}%: "
                f"{verdict(slower <= DEFAULT_VS_FULL_TARGET)})"
            )
        fraction = full["roofline_fraction"]
        target = FULL_ROOFLINE_TARGETS.get(preset)
        notes.append(
            f"full graphs at batch 1: {fraction:.2f} of the memory roofline"
            + ("" if target is None else f" (target >= {target}: {verdict(fraction >= target)})")
        )
    if piecewise is not None and full is not None:
        ratio = piecewise["p50_ms"] / full["p50_ms"]
        target = PIECEWISE_VS_FULL_TARGETS.get(preset)
        notes.append(
            f"piecewise vs full graphs at batch 1: {ratio:.2f}x step time"
            + ("" if target is None else f" (target <= {target}x: {verdict(ratio <= target)})")
        )
    notes += _reduce_overhead_notes(rows)
    return notes


def _reduce_overhead_notes(rows: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """Each graph variant against reduce-overhead at its slowest batch size."""
    notes = []
    for variant in (PIECEWISE, FULL):
        ratios = {
            batch: row["p50_ms"] / rows[(REDUCE_OVERHEAD, batch)]["p50_ms"]
            for (name, batch), row in rows.items()
            if name == variant and (REDUCE_OVERHEAD, batch) in rows
        }
        if ratios:
            batch = max(ratios, key=ratios.__getitem__)
            notes.append(
                f"{variant} vs reduce-overhead, slowest batch size ({batch}): "
                f"{ratios[batch]:.2f}x step time (target < 1x at every batch size: "
                f"{verdict(ratios[batch] < 1)})"
            )
    return notes


def markdown(result: dict[str, Any], notes: list[str]) -> str:
    bandwidth, after = result["read_bandwidth"], result["read_bandwidth_after"]
    lines = [
        f"GPU decode step, preset {result['preset']}, {result['dtype']}, "
        f"{result['iterations']} steps, on {result['platform']}",
        "",
        f"Read bandwidth {bandwidth['bytes_per_second'] / 1e9:.1f} GB/s "
        f"({bandwidth['probe_bytes'] // 2**20} MiB probe; "
        f"{after['bytes_per_second'] / 1e9:.1f} GB/s after the steps).",
        "",
        "| variant | batch | p50 ms | p90 ms | vs eager | MB/step | roofline ms "
        "| of roofline | capture s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in result["measurements"]:
        lines.append(
            f"| {m['variant']} | {m['batch_size']} | {m['p50_ms']:.3f} | {m['p90_ms']:.3f} "
            f"| {m['speedup_vs_eager']:.2f}x | {m['bytes_per_step'] / 1e6:.1f} "
            f"| {m['roofline_ms']:.3f} | {m['roofline_fraction']:.2f} "
            f"| {m['capture_seconds']:.3f} |"
        )
    lines += [
        "",
        "Whole decode steps through `ModelRunner.step` (inputs, metadata, model, logits, "
        "greedy sampling) against the model's step alone (`execute`, above):",
        "",
        "| variant | batch | step p50 ms | step p90 ms | execute p50 ms | around the model ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in result["whole_steps"]:
        lines.append(
            f"| {row['variant']} | {row['batch_size']} | {row['p50_ms']:.3f} "
            f"| {row['p90_ms']:.3f} | {row['execute_p50_ms']:.3f} "
            f"| {row['around_model_ms']:+.3f} |"
        )
    return "\n".join([*lines, "", *(f"- {note}" for note in notes)]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-sizes", default="1,8,32", help="comma-separated")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma-separated")
    parser.add_argument("--backend", default="inductor", help="compiler of the level-3 pieces")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--name", default="gpu_decode", help="results go to NAME.json and NAME.md")
    parser.add_argument(
        "--float32-reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also build a float32 eager model to compare the logits with "
        "(--no-float32-reference saves a large model's set-up and memory)",
    )
    add_output_args(parser)
    args = parser.parse_args()
    configure_logging()
    if current_platform.get_graph_api() is None:
        raise SystemExit(
            f"gpu_decode needs a platform with static graphs (cuda), not {current_platform.name}"
        )
    batch_sizes = [int(size) for size in args.batch_sizes.split(",")]
    setups: list[VariantSetup] = []
    result = run_benchmark(
        args.preset,
        batch_sizes,
        CompilationConfig(backend=args.backend, disable_cache=True),
        variants=args.variants.split(","),
        prompt_len=PROMPT_LEN,
        iterations=args.iterations,
        warmups=WARMUPS,
        dtype=torch.bfloat16,
        progress=False,
        float32_reference=args.float32_reference,
        on_setup=setups.append,
    ).as_dict()
    LOG.info("timing whole steps through ModelRunner.step")
    whole = time_whole_steps(setups, batch_sizes, args.iterations)
    result["whole_steps"] = with_model_steps(whole, result)
    notes = target_notes(result, len(batch_sizes))
    publish(args.name, {**result, "notes": notes}, markdown(result, notes), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
