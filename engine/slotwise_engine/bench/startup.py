"""Start-up time: fresh processes timed from their start to the first generated token.

Three variants, each in new processes of this interpreter: ``eager`` (level 0), ``cold``
(level 3 with empty caches, slotwise's and Inductor's) and ``warm`` (level 3 again, with
the caches the cold run of the same round filled). Each child reports its phases, the
files in its caches when it started and its compilation counters (so a report shows that
cold started empty and warm compiled nothing); the parent reports medians over
``repeats`` rounds, so ratios come from one run. ``layers`` overrides a preset's number
of layers: a warm start should cost about the same for 2 layers as for 16.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

PHASES = ("imports", "platform", "model", "dynamo", "compile_or_load", "capture", "first_step")
#: What each child counts besides time: files in its caches at start, then its compiles.
COUNTS = (
    "dynamo_imported",
    "cached_files_at_start",
    "inductor_compiles",
    "cache_hits",
    "cache_misses",
)
VARIANTS = ("eager", "cold", "warm")
PROMPT = [1, 5, 9, 3, 7, 2, 8, 4]


def run_startup_benchmark(
    model: str,
    repeats: int,
    config_json: str,
    *,
    layers: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Medians of ``repeats`` rounds of eager, cold and warm children for ``model`` (with
    ``layers`` layers instead of the preset's, when given)."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    for round_index in range(repeats):
        with tempfile.TemporaryDirectory(prefix="slotwise-startup-") as folder:
            for variant in VARIANTS:
                if progress:
                    print(f"round {round_index + 1}/{repeats}: {variant}", file=sys.stderr)
                samples[variant].append(_child(variant, model, layers, config_json, folder))
    result: dict[str, Any] = {"model": model, "layers": layers, "repeats": repeats}
    for variant, runs in samples.items():
        result[variant] = {
            key: round(statistics.median(run[key] for run in runs), 4) for key in runs[0]
        }
    result["warm_over_eager"] = round(result["warm"]["total_s"] / result["eager"]["total_s"], 3)
    result["warm_over_cold"] = round(result["warm"]["total_s"] / result["cold"]["total_s"], 3)
    return result


def _child(
    variant: str, model: str, layers: int | None, config_json: str, folder: str
) -> dict[str, float]:
    # Without TORCHINDUCTOR_CACHE_DIR, as users run by default: slotwise keeps Inductor's
    # cache inside its own, which is the round's folder, empty for the cold child.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLOTWISE_") and k != "TORCHINDUCTOR_CACHE_DIR"
    }
    command = [sys.executable, "-m", "slotwise_engine.bench.startup", variant, model, config_json]
    command += [os.path.join(folder, "slotwise"), str(layers or "")]
    start = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} start-up child failed:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report.pop("tokens")
    first_token = report.pop("first_token_at")
    report["total_s"] = first_token - start
    report["interpreter_s"] = report["total_s"] - sum(report[p] for p in PHASES)
    return report


def _child_main(variant: str, model: str, config_json: str, cache_dir: str, layers: str) -> None:
    """One timed start: phases measured here, the total by the parent from spawn time."""
    cached_files = _files_under(cache_dir)
    phases = dict.fromkeys(PHASES, 0.0)
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] += now - mark
        mark = now

    import torch

    from slotwise.compilation import counters
    from slotwise.compilation.config import CompilationConfig
    from slotwise_engine.bench.decode import build_model
    from slotwise_engine.models.llama import PRESETS, build_llama
    from slotwise_engine.runner.model_runner import ModelRunner
    from slotwise_engine.serving.generation import generate_token_ids

    if variant != "eager":
        # What compiling imports (Dynamo among it), which an eager start never loads.
        from slotwise.compilation.splitting import dynamo_backends
    lap("imports")
    from slotwise.platforms import get_current_platform

    get_current_platform()
    lap("platform")
    if variant == "eager":
        config = CompilationConfig(level=0)
    else:
        config = CompilationConfig.from_dict(json.loads(config_json)).replace(
            level=3, cache_dir=cache_dir
        )
    if layers:
        preset = dataclasses.replace(PRESETS[model], num_layers=int(layers))
        built = build_llama(
            preset,
            dtype=torch.float32,
            device=get_current_platform().device_type,
            compilation_config=config,
        )
    else:
        built = build_model(model, dtype=torch.float32, compilation_config=config)
    runner = ModelRunner(built, num_blocks=8)
    lap("model")
    backend_seconds = 0.0
    if variant != "eager":
        build = dynamo_backends.TraceOnceBackend.build

        def timed_build(self: Any, graph: Any, example_inputs: list[Any]) -> Any:
            nonlocal backend_seconds
            started = time.perf_counter()
            try:
                return build(self, graph, example_inputs)
            finally:
                backend_seconds += time.perf_counter() - started

        dynamo_backends.TraceOnceBackend.build = timed_build  # type: ignore[method-assign]
    tokens = generate_token_ids(runner, [PROMPT], 1)
    first_token_at = time.time()
    first_call = time.perf_counter() - mark
    phases["compile_or_load"] = backend_seconds
    phases["dynamo"] = 0.0 if variant == "eager" else _dynamo_seconds(first_call, backend_seconds)
    phases["first_step"] = first_call - phases["compile_or_load"] - phases["dynamo"]
    mark = time.perf_counter()
    runner.capture(progress=False)
    lap("capture")
    counts = {
        "dynamo_imported": int("torch._dynamo" in sys.modules),
        "cached_files_at_start": cached_files,
        "inductor_compiles": counters.num_inductor_compiles,
        "cache_hits": counters.num_cache_hits,
        "cache_misses": counters.num_cache_misses,
    }
    print(json.dumps({**phases, **counts, "first_token_at": first_token_at, "tokens": tokens}))


def _files_under(*folders: str) -> int:
    """How many files the caches hold: none for a cold start, the cold run's for warm."""
    return sum(len(files) for folder in folders for _, _, files in os.walk(folder))


def _dynamo_seconds(first_call: float, backend_seconds: float) -> float:
    """Time of the first call in Dynamo: its own counters, or zero on a warm start."""
    from torch._dynamo.utils import compilation_time_metrics

    traced = sum(
        sum(times) for name, times in compilation_time_metrics.items() if "compile_inner" in name
    )
    return max(0.0, min(first_call, traced) - backend_seconds) if traced else 0.0


if __name__ == "__main__":
    _child_main(*sys.argv[1:6])
