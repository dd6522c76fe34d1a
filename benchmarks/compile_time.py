"""Measure level-3 Inductor compile time: cold against warm cache, 2 against 16 layers.

Why: compilation happens when a model is first called, so it is start-up latency that
every process pays.  Two properties keep it small, and this script checks both:

* the persistent compile cache: a second process with the same model and config loads
  the compiled pieces instead of compiling them (target: warm <= 0.2x cold);
* piece reuse: the middle layers of a transformer split into identical pieces that are
  compiled once, so compile time barely grows with depth (target: cold with 16 layers
  <= 1.5x cold with 2 layers).

Every measurement runs in a fresh subprocess of the current interpreter (this file with
``--child``), which times the construction of ``slotwise.testing.toy_models.
ToyTransformer`` plus its first call (level 3, ``backend="inductor"``, split at the toy
attention op, graph mode ``NONE``) and reports the compilation counters as JSON.  A cold
run gets a fresh temporary slotwise ``cache_dir`` and a fresh ``TORCHINDUCTOR_CACHE_DIR``,
so neither slotwise's cache nor Inductor's own caches (FX graph, AOTAutograd, compiled
C++) make it warm; the warm run that follows reuses both folders.  Each of ``--repeats``
rounds runs cold then warm for 2 and for 16 layers (alternating which goes first) and a
baseline child that times ``import torch`` and the first ``torch.compile`` of a one-line
function with Inductor (fresh cache), the fixed cost any first compile pays.  Ratios are
of medians over rounds, all from this one run.  The children run without ``SLOTWISE_*``
variables, so the cpu platform resolves and the cache is on.

Results go to ``<out-dir>/compile_time.json`` and ``<out-dir>/compile_time.md``; the
Markdown (or the JSON with ``--json``) is printed to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    LOG,
    add_output_args,
    configure_logging,
    environment,
    publish,
    summary,
    utc_timestamp,
    verdict,
)

WARM_TARGET = 0.2
DEPTH_TARGET = 1.5
SHALLOW, DEEP = 2, 16
DEFAULT_REPEATS = 3
HIDDEN = 16
VOCAB = 64
NUM_TOKENS = 8
CHILD_TIMEOUT_S = 900
REPORTED_COUNTERS = (
    "num_piecewise_graphs_seen",
    "num_piecewise_capturable_graphs_seen",
    "num_backend_compilations",
    "num_inductor_compiles",
    "num_cache_hits",
    "num_cache_misses",
)


# -- child side: runs in the fresh subprocess -------------------------------------------


def child_model(layers: int, cache_dir: str) -> dict[str, Any]:
    """Time construction plus first call of a ``layers``-layer ToyTransformer."""
    start = time.perf_counter()
    import torch

    from slotwise.compilation import CompilationConfig, counters
    from slotwise.testing.toy_models import TOY_SPLITTING_OPS, ToyTransformer

    imported = time.perf_counter()
    config = CompilationConfig(
        level=3,
        backend="inductor",
        splitting_ops=TOY_SPLITTING_OPS,
        graph_mode="NONE",
        cache_dir=cache_dir,
    )
    torch.manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (NUM_TOKENS,))
    before = counters.snapshot()
    begin = time.perf_counter()
    model = ToyTransformer(num_layers=layers, hidden=HIDDEN, vocab=VOCAB, compilation_config=config)
    with torch.no_grad():
        model(input_ids)
    compiled = time.perf_counter()
    with torch.no_grad():
        model(input_ids[: NUM_TOKENS // 2])
    second = time.perf_counter()
    after = counters.snapshot()
    return {
        "layers": layers,
        "import_s": imported - start,
        "compile_s": compiled - begin,
        "second_call_ms": (second - compiled) * 1000.0,
        "counters": {name: after[name] - before[name] for name in REPORTED_COUNTERS},
    }


def child_baseline() -> dict[str, Any]:
    """Time ``import torch`` and the first Inductor compile of a one-line function."""
    start = time.perf_counter()
    import torch

    imported = time.perf_counter()

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + 1

    compiled_tiny = torch.compile(tiny, backend="inductor")
    begin = time.perf_counter()
    compiled_tiny(torch.randn(NUM_TOKENS, HIDDEN))
    done = time.perf_counter()
    return {"import_torch_s": imported - start, "first_compile_s": done - begin}


# -- parent side ------------------------------------------------------------------------


def child_env(inductor_cache: Path) -> dict[str, str]:
    """The environment without SLOTWISE_* variables, with Inductor's cache redirected."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache)
    return env


def children_cpu_s() -> float:
    """User plus system CPU seconds of every finished child process (and their children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_child(args: list[str], inductor_cache: Path) -> dict[str, Any]:
    """Run this file with ``--child`` and ``args``; its last stdout line is its JSON."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    cpu_before = children_cpu_s()
    start = time.perf_counter()
    result = subprocess.run(
        command,
        env=child_env(inductor_cache),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    wall = time.perf_counter() - start
    cpu = children_cpu_s() - cpu_before
    if result.returncode != 0:
        raise RuntimeError(
            f"child {' '.join(args)} failed with exit code {result.returncode}:\n"
            f"{result.stderr[-4000:]}"
        )
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    data["process_s"] = wall
    data["process_cpu_s"] = cpu
    return data


def run_pair(layers: int, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A cold run with fresh caches under ``root``, then a warm run reusing them."""
    cache_dir, inductor_cache = root / "slotwise", root / "inductor"
    model_args = ["model", "--layers", str(layers), "--cache-dir", str(cache_dir)]
    cold = run_child(model_args, inductor_cache)
    LOG.info("  %2d layers cold: %.2f s %s", layers, cold["compile_s"], cold["counters"])
    warm = run_child(model_args, inductor_cache)
    LOG.info("  %2d layers warm: %.2f s %s", layers, warm["compile_s"], warm["counters"])
    return cold, warm


def measure(repeats: int) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """``repeats`` rounds of: baseline, then cold/warm pairs for both depths."""
    runs: dict[str, list[dict[str, Any]]] = {
        f"{kind}_{layers}": [] for layers in (SHALLOW, DEEP) for kind in ("cold", "warm")
    }
    baselines = []
    for i in range(repeats):
        LOG.info("round %d/%d", i + 1, repeats)
        with tempfile.TemporaryDirectory(prefix="slotwise-bench-") as tmp:
            baseline = run_child(["baseline"], Path(tmp) / "baseline-inductor")
            LOG.info(
                "  baseline: import torch %.2f s, first compile %.2f s",
                baseline["import_torch_s"],
                baseline["first_compile_s"],
            )
            baselines.append(baseline)
            order = (SHALLOW, DEEP) if i % 2 == 0 else (DEEP, SHALLOW)
            for layers in order:
                cold, warm = run_pair(layers, Path(tmp) / f"layers{layers}")
                runs[f"cold_{layers}"].append(cold)
                runs[f"warm_{layers}"].append(warm)
    return runs, baselines


def median_of(items: list[dict[str, Any]], key: str) -> float:
    """Median of ``item[key]`` over ``items``."""
    return statistics.median(item[key] for item in items)


def ratios(runs: dict[str, list[dict[str, Any]]], key: str) -> tuple[dict[str, float], float]:
    """Warm/cold per depth and cold deep/cold shallow, as ratios of medians of ``key``."""
    med = {name: median_of(items, key) for name, items in runs.items()}
    warm = {
        str(layers): round(med[f"warm_{layers}"] / med[f"cold_{layers}"], 3)
        for layers in (SHALLOW, DEEP)
    }
    return warm, round(med[f"cold_{DEEP}"] / med[f"cold_{SHALLOW}"], 3)


def build_report(repeats: int) -> dict[str, Any]:
    """Run every measurement and collect the results into one dict."""
    runs, baselines = measure(repeats)
    warm_ratio, depth_ratio = ratios(runs, "compile_s")
    cpu_warm_ratio, cpu_depth_ratio = ratios(runs, "process_cpu_s")
    warm_runs = [run for name, items in runs.items() if name.startswith("warm") for run in items]
    warm_compiled = any(run["counters"]["num_inductor_compiles"] for run in warm_runs)
    warm_ok = all(value <= WARM_TARGET for value in warm_ratio.values())
    depth_ok = depth_ratio <= DEPTH_TARGET
    return {
        **environment(),
        "repeats": repeats,
        "model": {"hidden": HIDDEN, "vocab": VOCAB, "num_tokens": NUM_TOKENS},
        "runs": {
            name: {
                "compile_s": summary([run["compile_s"] for run in items], 3),
                "process_s": summary([run["process_s"] for run in items], 3),
                "process_cpu_s": summary([run["process_cpu_s"] for run in items], 3),
                "import_s": summary([run["import_s"] for run in items], 3),
                "counters": items[0]["counters"],
                "counters_same_every_run": all(
                    run["counters"] == items[0]["counters"] for run in items
                ),
                "samples": items,
            }
            for name, items in runs.items()
        },
        "baseline": {
            "import_torch_s": summary([b["import_torch_s"] for b in baselines], 3),
            "first_compile_s": summary([b["first_compile_s"] for b in baselines], 3),
        },
        "warm_ratio": warm_ratio,
        "warm_target": WARM_TARGET,
        "meets_warm_target": warm_ok,
        "warm_runs_compiled": warm_compiled,
        "depth_ratio": depth_ratio,
        "depth_target": DEPTH_TARGET,
        "meets_depth_target": depth_ok,
        "meets_targets": warm_ok and depth_ok,
        "process_cpu_warm_ratio": cpu_warm_ratio,
        "process_cpu_depth_ratio": cpu_depth_ratio,
        "timestamp": utc_timestamp(),
    }


def render_markdown(report: dict[str, Any]) -> str:
    """A Markdown table of the runs, followed by the verdict lines."""
    lines = [
        "| run | layers | compile (s), median | min | max | process wall (s) | process CPU (s) "
        "| Inductor compiles | cache hits | cache misses |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, run in report["runs"].items():
        kind, layers = name.split("_")
        c, t = run["counters"], run["compile_s"]
        lines.append(
            f"| {kind} | {layers} | {t['median']:.2f} | {t['min']:.2f} | {t['max']:.2f} "
            f"| {run['process_s']['median']:.2f} | {run['process_cpu_s']['median']:.2f} "
            f"| {c['num_inductor_compiles']} | {c['num_cache_hits']} | {c['num_cache_misses']} |"
        )
    base = report["baseline"]
    warm = ", ".join(f"{layers} layers {r:.3f}x" for layers, r in report["warm_ratio"].items())
    cpu_warm = ", ".join(
        f"{layers} layers {r:.3f}x" for layers, r in report["process_cpu_warm_ratio"].items()
    )
    lines += [
        "",
        f"warm / cold: {warm} (target <= {report['warm_target']}x): "
        f"**{verdict(report['meets_warm_target'])}**",
        f"cold {DEEP} layers / cold {SHALLOW} layers: {report['depth_ratio']:.3f}x "
        f"(target <= {report['depth_target']}x): **{verdict(report['meets_depth_target'])}**",
        f"same ratios of whole-process CPU time (imports included; less sensitive to other "
        f"load): warm / cold {cpu_warm}; cold {DEEP} / cold {SHALLOW} "
        f"{report['process_cpu_depth_ratio']:.3f}x",
        f"baseline (median): import torch {base['import_torch_s']['median']:.2f} s, first "
        f"Inductor compile of a one-line function {base['first_compile_s']['median']:.2f} s",
        f"warm runs compiled with Inductor: {report['warm_runs_compiled']}",
        f"rounds: {report['repeats']}, python {report['python_version']}, "
        f"torch {report['torch_version']}",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--child`` is for the subprocesses this script starts)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="rounds of cold/warm pairs"
    )
    add_output_args(parser)
    parser.add_argument("--child", choices=("model", "baseline"), help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=SHALLOW, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    configure_logging()
    args = parse_args(argv)
    if args.child == "model":
        print(json.dumps(child_model(args.layers, args.cache_dir)))
        return 0
    if args.child == "baseline":
        print(json.dumps(child_baseline()))
        return 0
    report = build_report(args.repeats)
    markdown = render_markdown(report)
    publish("compile_time", report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
