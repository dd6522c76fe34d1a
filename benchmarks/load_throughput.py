"""Measure how fast ``slotwise_engine.models.load_model`` reads a Hugging Face checkpoint.

Why: a loader should cost about the time to read the weights' bytes; building the
model first with random weights, or copying every tensor twice, would double it.
The script writes a random Llama checkpoint at run time (default: hidden 1024,
8 layers, vocabulary 32000, bfloat16, about 320 MB, as sharded safetensors files
with an index, the way ``save_pretrained`` writes them) and times, in one process,
round-robin over ``--rounds`` rounds after one untimed warm-up round:

* ``load_file (lazy)``: ``safetensors.torch.load_file`` on every file.  It returns
  tensors backed by the memory-mapped file, so it reads almost nothing: shown
  for scale, not as the baseline;
* ``load_file + copy`` (the raw read): the same, then each tensor copied into
  new memory, which is what holding the weights in memory costs;
* ``slotwise``: ``load_model(folder)``, model construction included;
* ``transformers``: ``AutoModelForCausalLM.from_pretrained(folder)``, if installed;
* ``load_file + copy, half columns`` and ``slotwise, half columns``: the first half of
  the columns of every matrix copied into buffers allocated once, from ``load_file``'s
  mapped tensors or with ``CheckpointTensor.copy_to``: what a tensor-parallel rank of
  two reads of its row-parallel weights, the slices whose runs lie apart in the file.

Throughput is the checkpoint's tensor bytes over the median time (for the half
columns, half of them).  The target is slotwise at least 0.8x the raw read.  The files
are read from the page cache (they were just written): this measures the loader's
copying, not the disk.

Results go to ``<out-dir>/load_throughput.json`` and ``<out-dir>/load_throughput.md``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    LOG,
    add_output_args,
    configure_logging,
    environment,
    package_version,
    publish,
    utc_timestamp,
    verdict,
)

TARGET_RATIO = 0.8
DTYPES = ("bfloat16", "float32")


def write_checkpoint(folder: Path, args: argparse.Namespace) -> int:
    """A random Llama checkpoint in ``folder``, one layer per shard; its tensor bytes."""
    import torch
    from safetensors.torch import save_file

    dtype = getattr(torch, args.dtype)
    hidden, inter, vocab = args.hidden_size, 4 * args.hidden_size, args.vocab_size
    heads, head_dim = args.hidden_size // 64, 64
    kv = heads // 2
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    shards: list[dict[str, tuple[int, ...]]] = [shapes, {"lm_head.weight": (vocab, hidden)}]
    for i in range(args.layers):
        prefix = f"model.layers.{i}"
        shards.append(
            {
                f"{prefix}.input_layernorm.weight": (hidden,),
                f"{prefix}.post_attention_layernorm.weight": (hidden,),
                f"{prefix}.self_attn.q_proj.weight": (heads * head_dim, hidden),
                f"{prefix}.self_attn.k_proj.weight": (kv * head_dim, hidden),
                f"{prefix}.self_attn.v_proj.weight": (kv * head_dim, hidden),
                f"{prefix}.self_attn.o_proj.weight": (hidden, heads * head_dim),
                f"{prefix}.mlp.gate_proj.weight": (inter, hidden),
                f"{prefix}.mlp.up_proj.weight": (inter, hidden),
                f"{prefix}.mlp.down_proj.weight": (hidden, inter),
            }
        )
    weight_map, total = {}, 0
    for index, shard in enumerate(shards, start=1):
        name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        tensors = {key: (torch.randn(shape) * 0.02).to(dtype) for key, shape in shard.items()}
        save_file(tensors, folder / name, metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(shard, name))
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_file))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": args.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": args.dtype,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return total


def variants(folder: Path) -> dict[str, Callable[[], Any]]:
    """Each way to load ``folder``, as a function returning what it loaded."""
    import torch
    from safetensors.torch import load_file

    from slotwise_engine.models import load_model
    from slotwise_engine.models.checkpoint import Checkpoint

    files = sorted(folder.glob("*.safetensors"))
    halves = {
        name: torch.zeros(tensor.shape[0], tensor.shape[1] // 2, dtype=tensor.dtype)
        for file in files
        for name, tensor in load_file(file).items()
        if tensor.dim() == 2
    }

    def lazy() -> list[Any]:
        return [load_file(f) for f in files]

    def copied() -> list[Any]:
        return [{k: t.clone() for k, t in load_file(f).items()} for f in files]

    def copied_columns() -> None:
        for file in files:
            for name, tensor in load_file(file).items():
                if name in halves:
                    halves[name].copy_(tensor[:, : halves[name].shape[1]])

    def read_columns() -> None:
        with Checkpoint(folder) as checkpoint:
            for name, half in halves.items():
                checkpoint.tensor(name).copy_to(half, (slice(None), slice(0, half.shape[1])))

    loaders = {
        "load_file (lazy)": lazy,
        "load_file + copy": copied,
        "slotwise": lambda: load_model(folder, compilation_config={"level": 0}),
        "load_file + copy, half columns": copied_columns,
        "slotwise, half columns": read_columns,
    }
    if importlib.util.find_spec("transformers") is not None:
        import transformers

        loaders["transformers"] = lambda: transformers.AutoModelForCausalLM.from_pretrained(folder)
    return loaders


def measure(loaders: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """One untimed round, then ``rounds`` timed ones, each variant once per round."""
    samples: dict[str, list[float]] = {name: [] for name in loaders}
    for round_index in range(rounds + 1):
        LOG.info("round %d/%d%s", round_index, rounds, " (warm-up)" if not round_index else "")
        for name, load in loaders.items():
            gc.collect()
            start = time.perf_counter()
            loaded = load()
            seconds = time.perf_counter() - start
            del loaded
            if round_index:
                samples[name].append(seconds)
    return samples


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="slotwise-load-") as tmp:
        folder = Path(tmp)
        LOG.info("writing the checkpoint")
        nbytes = write_checkpoint(folder, args)
        samples = measure(variants(folder), args.rounds)
    results = {}
    for name, times in samples.items():
        median = statistics.median(times)
        read = nbytes / 2 if name.endswith("half columns") else nbytes  # about half
        results[name] = {
            "median_s": round(median, 4),
            "min_s": round(min(times), 4),
            "max_s": round(max(times), 4),
            "gb_per_s": round(read / median / 1e9, 3),
        }
    ratio = results["load_file + copy"]["median_s"] / results["slotwise"]["median_s"]
    columns_ratio = (
        results["load_file + copy, half columns"]["median_s"]
        / results["slotwise, half columns"]["median_s"]
    )
    return {
        **environment(),
        "transformers_version": package_version("transformers"),
        "safetensors_version": package_version("safetensors"),
        "checkpoint": {
            "hidden_size": args.hidden_size,
            "layers": args.layers,
            "vocab_size": args.vocab_size,
            "dtype": args.dtype,
            "tensor_bytes": nbytes,
        },
        "rounds": args.rounds,
        "results": results,
        "slotwise_vs_raw_read": round(ratio, 3),
        "half_columns_slotwise_vs_raw_read": round(columns_ratio, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "timestamp": utc_timestamp(),
    }


def render_markdown(report: dict[str, Any]) -> str:
    checkpoint = report["checkpoint"]
    lines = [
        f"Checkpoint: Llama, hidden {checkpoint['hidden_size']}, {checkpoint['layers']} layers, "
        f"vocabulary {checkpoint['vocab_size']}, {checkpoint['dtype']}, "
        f"{checkpoint['tensor_bytes'] / 1e6:.0f} MB of tensors; {report['rounds']} rounds.",
        "",
        "| loader | median (s) | min (s) | max (s) | GB/s (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"| {name} | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} "
            f"| {r['gb_per_s']:.2f} |"
        )
    lines += [
        "",
        f"slotwise / raw read (load_file + copy): {report['slotwise_vs_raw_read']:.2f}x "
        f"(target >= {report['target_ratio']}x): **{verdict(report['meets_target'])}**",
        "",
        "half columns of every matrix (a tensor-parallel rank's row-parallel share), "
        f"slotwise / raw read: {report['half_columns_slotwise_vs_raw_read']:.2f}x",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default: 5)")
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    add_output_args(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    args = parse_args(argv)
    report = build_report(args)
    markdown = render_markdown(report)
    publish("load_throughput", report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
