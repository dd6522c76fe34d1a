"""Decode attention on the CPU: the plugin's paged kernel against gathering into SDPA.

Why: a decode step's attention must read each request's cached keys and values once;
its cost should follow those bytes, not the longest request's padding nor a dense copy
of every block.  The script times one layer's decode attention (the ``small`` preset's
heads: 8 query and 4 key/value heads of 64, blocks of 16 tokens, blocks scattered over
the cache as a long-running server leaves them) in two ways, interleaved round by round:

* ``gathered``: CPU_SDPA's path without the kernel: ``key_cache[block_table]`` into a
  dense, padded copy, then one batched ``scaled_dot_product_attention`` with a mask;
* ``paged kernel``: ``slotwise_cpu.paged_decode``, reading the blocks in place.

For each batch it reports the bytes of keys and values the requests hold, each path's
median time and the rate at which it got through those bytes, and the KV roofline:
those bytes over the read bandwidth that ``slotwise bench``'s probe measures with the
same thread count.  A ragged batch (half the requests long, half short) shows whether
the cost follows the bytes or the padding.  Outputs are checked against each other.

One layer's keys and values stay in this machine's last-level cache between rounds,
which a decode step does not allow: it reads every layer's in turn.  ``--layers N``
gives each batch N layers' caches and times each path over all of them per round
(reported per layer), so that with a step's worth (8 for the ``small`` preset) they are
read from memory.

Results go to ``<out-dir>/cpu_decode_attention.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any

from common import (
    LOG,
    add_dtypes_arg,
    add_output_args,
    configure_logging,
    environment,
    publish,
    utc_timestamp,
)

HEADS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 8, 4, 64, 16
#: name -> tokens each request holds (the new one included).
BATCHES = {
    "1 x 33": [33],
    "16 x 33": [33] * 16,
    "1 x 2048": [2048],
    "16 x 2048": [2048] * 16,
    "16 ragged (8 x 2048, 8 x 128)": [2048, 128] * 8,
}


def build_case(lengths: list[int], dtype: Any, seed: int, layers: int) -> dict[str, Any]:
    import torch

    from slotwise_cpu.attention import CpuSdpaBackend

    generator = torch.Generator().manual_seed(seed)
    width = max(math.ceil(n / BLOCK_SIZE) for n in lengths)
    num_blocks = sum(math.ceil(n / BLOCK_SIZE) for n in lengths) + 1
    shape = CpuSdpaBackend.get_kv_cache_shape(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_SIZE)
    # Each request's blocks drawn at random from the cache; rows padded with block 0.
    order = torch.randperm(num_blocks - 1, generator=generator) + 1
    table = torch.zeros(len(lengths), width, dtype=torch.int32)
    taken = 0
    for r, n in enumerate(lengths):
        count = math.ceil(n / BLOCK_SIZE)
        table[r, :count] = order[taken : taken + count]
        taken += count
    return {
        "kv_caches": [torch.randn(shape, generator=generator).to(dtype) for _ in range(layers)],
        "table": table,
        "lengths": torch.tensor(lengths, dtype=torch.int32),
        "q": torch.randn(len(lengths), HEADS, HEAD_SIZE, generator=generator).to(dtype),
        "kv_bytes": sum(lengths) * KV_HEADS * HEAD_SIZE * 2 * torch.finfo(dtype).bits // 8,
    }


def measure(case: dict[str, Any], iterations: int) -> dict[str, Any]:
    import torch

    from slotwise_cpu import paged_decode
    from slotwise_cpu.attention import CpuSdpaImpl

    impl = CpuSdpaImpl(HEADS, HEAD_SIZE, HEAD_SIZE**-0.5, KV_HEADS)
    if not paged_decode.available():
        raise SystemExit("the paged decode kernel could not be built; see the warning above")
    out = torch.empty_like(case["q"])
    kv_caches, table, lengths, q = (case[k] for k in ("kv_caches", "table", "lengths", "q"))

    def gathered(kv_cache: Any) -> Any:
        keys, values = kv_cache.unbind(0)
        return impl._decode(q, keys, values, table, lengths)

    def paged(kv_cache: Any) -> Any:
        paged_decode.paged_decode_op(q, kv_cache, table, lengths, out, HEAD_SIZE**-0.5)
        return out

    variants = {"gathered": gathered, "paged kernel": paged}
    difference = float((gathered(kv_caches[0]).float() - paged(kv_caches[0]).float()).abs().max())
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(iterations + 2):  # interleaved; the first two are warm-ups
        for name, fn in variants.items():
            start = time.perf_counter()
            for kv_cache in kv_caches:  # every layer in turn, as a step reads them
                fn(kv_cache)
            if round_index >= 2:
                samples[name].append((time.perf_counter() - start) / len(kv_caches))
    return {
        "kv_bytes": case["kv_bytes"],
        "max_abs_diff": difference,
        "p50_ms": {name: statistics.median(times) * 1e3 for name, times in samples.items()},
    }


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from slotwise_engine.bench.decode import measure_read_bandwidth

    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, dict[str, Any]] = {}
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for name, lengths in BATCHES.items():
            LOG.info("%s, %s", dtype_name, name)
            case = build_case(lengths, dtype, seed=len(lengths), layers=args.layers)
            row = measure(case, args.iterations)
            # The roofline of this batch's bytes, probed right before with a buffer as large.
            bandwidth = measure_read_bandwidth(row["kv_bytes"], device="cpu")
            row["read_bandwidth_gb_s"] = bandwidth.bytes_per_second / 1e9
            row["roofline_ms"] = row["kv_bytes"] / bandwidth.bytes_per_second * 1e3
            results[f"{dtype_name}, {name}"] = row
    return {
        **environment(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "heads": {"query": HEADS, "key_value": KV_HEADS, "size": HEAD_SIZE},
        "block_size": BLOCK_SIZE,
        "layers": args.layers,
        "iterations": args.iterations,
        "results": results,
        "timestamp": utc_timestamp(),
    }


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"One layer's decode attention, {report['heads']['query']} query and "
        f"{report['heads']['key_value']} key/value heads of {report['heads']['size']}, blocks "
        f"of {report['block_size']}; times per layer over {report['layers']} layers' caches "
        f"in turn; {report['iterations']} interleaved rounds, "
        f"{report['torch_threads']} threads, load average {report['load_average']:.1f}.",
        "",
        "| batch | KV MB | gathered ms | paged kernel ms | kernel GB/s | KV roofline ms "
        "| kernel / roofline | gathered / kernel | max \\|diff\\| |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in report["results"].items():
        gathered, paged = row["p50_ms"]["gathered"], row["p50_ms"]["paged kernel"]
        lines.append(
            f"| {name} | {row['kv_bytes'] / 1e6:.1f} | {gathered:.3f} | {paged:.3f} "
            f"| {row['kv_bytes'] / paged / 1e6:.1f} | {row['roofline_ms']:.3f} "
            f"| {paged / row['roofline_ms']:.2f}x | {gathered / paged:.2f}x "
            f"| {row['max_abs_diff']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=15, help="timed rounds per batch")
    add_dtypes_arg(parser, "comma-separated: float32, bfloat16, float16")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--layers",
        type=int,
        default=1,
        help="layers' caches per batch, read in turn (8: a small-preset step's, from memory)",
    )
    add_output_args(parser)
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    if args.layers < 1:
        parser.error("--layers must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    args = parse_args(argv)
    report = build_report(args)
    markdown = render_markdown(report)
    publish("cpu_decode_attention", report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
