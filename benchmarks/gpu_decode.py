"""Decode-step latency on an NVIDIA GPU: eager, piecewise and full CUDA graphs, torch.compile.

Run by tests/gpu/run_gpu_checks.sh on a machine with a GPU.  Targets (issue 4):
piecewise graphs at least 3x eager at batch 1, within 10% of full graphs, and a
capture of at most 50 ms per size.  "Full graphs" is FULL_AND_PIECEWISE: decode
steps, the ones timed here, replay one graph of the whole model.  It runs on any
platform with static graphs, so the script can be tried on the CPU first with
``SLOTWISE_PLATFORM=ascend_stub`` (simulated graphs; the timings mean nothing there).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from slotwise.compilation.config import CompilationConfig
from slotwise.decode_benchmark import run_benchmark
from slotwise.platforms import current_platform

logger = logging.getLogger("slotwise.benchmarks")

DEFAULT_VARIANTS = "eager,level3+graphs,level3+full_graphs,torch.compile:reduce-overhead"


def target_notes(result: dict[str, Any], num_sizes: int) -> list[str]:
    """The issue's targets, each with the value measured at batch 1 in this run."""
    rows = {(m["variant"], m["batch_size"]): m for m in result["measurements"]}
    piecewise = rows.get(("level3+graphs", 1))
    full = rows.get(("level3+full_graphs", 1))
    notes = []
    if piecewise is not None:
        capture_ms = piecewise["capture_seconds"] / num_sizes * 1e3
        notes += [
            f"piecewise vs eager at batch 1: {piecewise['speedup_vs_eager']:.2f}x (target >= 3x)",
            f"piecewise capture per size: {capture_ms:.1f} ms (target <= 50 ms)",
        ]
    if full is not None:
        notes.append(
            f"full graphs capture per size: {full['capture_seconds'] / num_sizes * 1e3:.1f} ms"
        )
    if piecewise is not None and full is not None:
        slower = piecewise["p50_ms"] / full["p50_ms"] - 1
        notes.append(
            f"piecewise vs full graphs at batch 1: {slower * 100:+.1f}% step time (target <= +10%)"
        )
    return notes


def markdown(result: dict[str, Any], notes: list[str]) -> str:
    lines = [
        f"GPU decode step, preset {result['preset']}, {result['dtype']}, "
        f"{result['iterations']} steps",
        "",
        "| variant | batch | p50 ms | p90 ms | vs eager | capture s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in result["measurements"]:
        lines.append(
            f"| {m['variant']} | {m['batch_size']} | {m['p50_ms']:.3f} | {m['p90_ms']:.3f} "
            f"| {m['speedup_vs_eager']:.2f}x | {m['capture_seconds']:.3f} |"
        )
    return "\n".join([*lines, "", *notes])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-sizes", default="1,8,32", help="comma-separated")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma-separated")
    parser.add_argument("--backend", default="inductor", help="compiler of the level-3 pieces")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if current_platform.get_graph_api() is None:
        raise SystemExit(
            f"gpu_decode needs a platform with static graphs (cuda), not {current_platform.name}"
        )

    batch_sizes = [int(size) for size in args.batch_sizes.split(",")]
    result = run_benchmark(
        args.preset,
        batch_sizes,
        CompilationConfig(backend=args.backend, disable_cache=True),
        variants=args.variants.split(","),
        iterations=args.iterations,
        dtype=torch.bfloat16,
        progress=False,
    ).as_dict()
    notes = target_notes(result, len(batch_sizes))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {**result, "notes": notes}
    (out_dir / "gpu_decode.json").write_text(json.dumps(report, indent=2))
    (out_dir / "gpu_decode.md").write_text(markdown(result, notes) + "\n")
    print(json.dumps(report, indent=2) if args.json else markdown(result, notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
