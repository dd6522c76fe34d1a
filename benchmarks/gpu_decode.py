"""Decode-step latency on an NVIDIA GPU: eager, piecewise CUDA graphs, torch.compile.

Run by tests/gpu/run_gpu_checks.sh on a machine with a GPU.  Targets (issue 4):
piecewise graphs at least 3x eager at batch 1, within 10% of full graphs, and a
capture of at most 50 ms per size.  Full graphs need an attention backend that can
be captured (graph_support ALWAYS); when the platform's backend cannot, the row is
reported as unsupported with the reason instead of being left out silently.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from slotwise.attention import GraphSupport
from slotwise.compilation.config import CompilationConfig
from slotwise.decode_benchmark import run_benchmark
from slotwise.platforms import current_platform

logger = logging.getLogger("slotwise.benchmarks")


def full_graph_support() -> str | None:
    """None when full graphs can run here, else why not."""
    backend = current_platform.get_attention_backend_cls(
        head_size=64, dtype=torch.bfloat16, block_size=16
    )
    if backend.graph_support == GraphSupport.ALWAYS:
        return None
    return f"attention backend {backend.get_name()} is {backend.graph_support.name}"


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
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if current_platform.name != "cuda":
        raise SystemExit(f"gpu_decode needs the cuda platform, not {current_platform.name}")

    batch_sizes = [1, 8, 32]
    variants = ["eager", "level3+graphs", "torch.compile:reduce-overhead"]
    result = run_benchmark(
        args.preset,
        batch_sizes,
        CompilationConfig(backend="inductor", disable_cache=True),
        variants=variants,
        iterations=args.iterations,
        dtype=torch.bfloat16,
        progress=False,
    ).as_dict()
    rows = {(m["variant"], m["batch_size"]): m for m in result["measurements"]}
    piecewise = rows[("level3+graphs", 1)]
    capture_per_size = piecewise["capture_seconds"] / len(batch_sizes)
    notes = [
        f"piecewise vs eager at batch 1: {piecewise['speedup_vs_eager']:.2f}x (target >= 3x)",
        f"capture per size: {capture_per_size * 1e3:.1f} ms (target <= 50 ms)",
    ]
    unsupported = full_graph_support()
    notes.append(
        f"full graphs: not measured, {unsupported}" if unsupported else "full graphs: supported"
    )
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {**result, "notes": notes}
    (out_dir / "gpu_decode.json").write_text(json.dumps(report, indent=2))
    (out_dir / "gpu_decode.md").write_text(markdown(result, notes) + "\n")
    print(json.dumps(report, indent=2) if args.json else markdown(result, notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
