"""What moves a CPU decode step toward the memory roofline: each candidate, measured.

Why: a batch-1 decode step reads every weight once, so it can go no faster than the
weights stream from memory; the CPU plugin keeps what is measured to bring it closer.
Two parts, each interleaved round by round, in one process:

1. *Products of 1 to 16 rows* (``--rows``) on the ``small`` preset's weight shapes (8
   layers of qkv, o, gate/up and down projections, and the LM head; 109 MB in float32):
   torch's ``F.linear`` (MKL for float32, oneDNN for bfloat16), the plugin's op (which
   gives the kernel the rows ``max_kernel_rows`` allows and torch the rest), the
   small-GEMM kernel called bare (its time without the op's dispatch, at any rows), and
   oneDNN's and MKL's prepacked linears (which need the weights packed ahead of time: the
   treatment Inductor's freezing gives constant weights; oneDNN's only in the dtypes it
   packs on this CPU, MKL's in float32).
2. *Level-3 variants* of the ``small`` preset at batch 1: split at attention (as on a
   platform with static graphs) with slotwise's own piecewise backend and with the CPU
   plugin's (one-row products on the small-GEMM op); the CPU plugin's default, the model
   as one graph; and that with each Inductor or config candidate on top: ``cpp_wrapper``
   (C++ instead of Python around the graph's kernels), ``max_autotune`` with the CPP GEMM
   template, ``custom_ops: ["all"]`` (the platform's RMSNorm kernel instead of Inductor's
   fused code), ``compile_sizes: [1]`` (a static-shape compile for batch 1); and the
   plugin's at one thread against the run's thread count.  Timed with them: the
   plugin's step's products alone, back to back on that model's weights; the step less
   that is the rest of the step (Python, dispatch, the other kernels).

Every variant's logits are compared with eager's.  The roofline is the bytes a step
reads over the probed read bandwidth (``slotwise_engine.bench.decode``), at the run's
thread count.  Results go to ``<out-dir>/cpu_decode_tuning.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from typing import Any

from common import (
    LOG,
    add_dtypes_arg,
    add_output_args,
    configure_logging,
    environment,
    publish,
    seconds_of,
    utc_timestamp,
)

from slotwise.stats import interleaved_timings

PROMPT_LEN = 32
#: The CPU plugin's default level-3 step, and its products timed alone.
PLUGIN_STEP = "level3, CPU plugin"
PRODUCTS_ALONE = "(its products alone, back to back)"
#: Splitting at attention, as slotwise does by default where a platform has static graphs.
SPLIT = {"splitting_ops": ["slotwise::unified_attention_with_output"]}
#: name -> (compilation config over level 3, use slotwise's own piecewise backend, threads)
LEVEL3_VARIANTS: dict[str, tuple[dict[str, Any], bool, int | None]] = {
    "level3 split, slotwise's piecewise backend": (SPLIT, True, None),
    "level3 split, CPU plugin": (SPLIT, False, None),
    PLUGIN_STEP: ({}, False, None),
    "+ cpp_wrapper": ({"inductor_config": {"cpp_wrapper": True}}, False, None),
    "+ max_autotune (CPP GEMM template)": (
        {"inductor_config": {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}},
        False,
        None,
    ),
    "+ custom_ops all": ({"custom_ops": ["all"]}, False, None),
    "+ compile_sizes [1]": ({"compile_sizes": [1]}, False, None),
    "CPU plugin, 1 thread": ({}, False, 1),
}


def weight_shapes() -> list[tuple[int, int]]:
    from slotwise_engine.models.llama import PRESETS

    c = PRESETS["small"]
    head = c.hidden_size // c.num_heads
    layer = [
        ((c.num_heads + 2 * c.num_kv_heads) * head, c.hidden_size),
        (c.hidden_size, c.num_heads * head),
        (2 * c.intermediate_size, c.hidden_size),
        (c.hidden_size, c.intermediate_size),
    ]
    return layer * c.num_layers + [(c.vocab_size, c.hidden_size)]


def onednn_packs(dtype: Any) -> bool:
    """Whether oneDNN prepacks weights of ``dtype`` on this CPU (its 2-byte paths need
    AVX-512 or AVX-NE-CONVERT, and refuse to pack otherwise)."""
    import torch

    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return True


def product_variants(dtype: Any, rows: int) -> tuple[dict[str, Callable[[], None]], int]:
    """One pass over every weight of the preset per variant, for ``rows`` rows of input;
    and the bytes it reads."""
    import ctypes

    import torch
    import torch.nn.functional as F

    from slotwise_cpu import linear, native

    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(shape, generator=generator).to(dtype) for shape in weight_shapes()]
    inputs = {k: torch.randn(rows, k, generator=generator).to(dtype) for _, k in weight_shapes()}
    pairs = [(inputs[w.shape[1]], w) for w in weights]
    variants = {"torch F.linear": lambda: [F.linear(x, w) for x, w in pairs]}
    library = native.load_kernels()
    if library is not None and dtype in linear.KERNEL_DTYPES:
        # The op as compiled pieces call it (it hands rows over max_kernel_rows to torch),
        # and the C kernel itself, called bare: the difference is the op's dispatch.
        variants["slotwise_cpu.linear op"] = lambda: [
            linear.linear_op(x, w, None) for x, w in pairs
        ]
        kernel = library.slotwise_small_gemm
        kernel.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            *[ctypes.c_int64] * 4,
            ctypes.c_int,
            ctypes.c_int,
        ]
        kernel.restype = ctypes.c_int
        code = linear.KERNEL_DTYPES[dtype]

        def bare_kernel() -> None:
            for x, w in pairs:
                out = torch.empty(rows, w.shape[0], dtype=dtype)
                kernel(
                    x.data_ptr(),
                    x.shape[1],
                    w.data_ptr(),
                    None,
                    out.data_ptr(),
                    w.shape[0],
                    rows,
                    w.shape[0],
                    w.shape[1],
                    code,
                    torch.get_num_threads(),
                )

        variants["small GEMM kernel, bare C call"] = bare_kernel
    if onednn_packs(dtype):
        packed = [(x, torch.ops.mkldnn._reorder_linear_weight(w, 1)) for x, w in pairs]
        variants["oneDNN prepacked"] = lambda: [
            torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for x, p in packed
        ]
    if dtype == torch.float32:
        mkl = [(x, torch.ops.mkl._mkl_reorder_linear_weight(w, rows), w) for x, w in pairs]
        variants["MKL prepacked"] = lambda: [
            torch.ops.mkl._mkl_linear(x, p, w, None, rows) for x, p, w in mkl
        ]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    return variants, nbytes


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds of each variant over ``rounds`` interleaved rounds, after two."""
    timers = {name: functools.partial(seconds_of, fn) for name, fn in variants.items()}
    samples = interleaved_timings(timers, rounds, warmups=2)
    return {name: statistics.median(times) for name, times in samples.items()}


@contextlib.contextmanager
def slotwise_piecewise_backend(enabled: bool) -> Iterator[None]:
    """The CPU platform handing its pieces to slotwise's own backend, while building."""
    from slotwise.platforms import get_current_platform

    platform = get_current_platform()
    if enabled:
        platform.get_piecewise_backend_cls = lambda **kwargs: None
    try:
        yield
    finally:
        platform.__dict__.pop("get_piecewise_backend_cls", None)


def level3_steps(
    dtype: Any, threads: int
) -> tuple[dict[str, Callable[[], Any]], dict[str, float], dict[str, float], int]:
    """Each variant's decode step (with its thread count), its logits' difference to
    eager and its compile seconds; and the bytes a step reads."""
    import torch

    from slotwise.compilation.config import CompilationConfig
    from slotwise_engine.bench.decode import DecodeStep, setup_variant

    steps: dict[str, Callable[[], Any]] = {}
    logits: dict[str, Any] = {}
    compile_seconds: dict[str, float] = {}
    for name, (config, own_backend, variant_threads) in {
        "eager": ({}, False, None),
        **LEVEL3_VARIANTS,
    }.items():
        LOG.info("%s: setting up %s", dtype, name)
        with slotwise_piecewise_backend(own_backend):
            setup = setup_variant(
                "eager" if name == "eager" else "level3", "small",
                CompilationConfig(**config), [1], PROMPT_LEN, progress=False, dtype=dtype,
            )  # fmt: skip
        step = DecodeStep.prepare(setup.runner, 1, PROMPT_LEN)
        count = variant_threads or threads

        def run(step: DecodeStep = step, count: int = count) -> Any:
            torch.set_num_threads(count)
            return step()

        steps[name] = run
        logits[name] = run().float()
        compile_seconds[name] = setup.compile_seconds
        if name == PLUGIN_STEP:
            steps[PRODUCTS_ALONE] = step_products(setup.runner.model, count)
    differences = {name: float((v - logits["eager"]).abs().max()) for name, v in logits.items()}
    return steps, differences, compile_seconds, step.bytes_read


def step_products(model: Any, threads: int) -> Callable[[], Any]:
    """The products of ``model``'s decode step at batch 1, called back to back through
    the linear op on the model's own weights, in the step's order: the step's time less
    this is what runs between the products (Python, dispatch, the other kernels)."""
    import torch

    from slotwise_cpu import linear

    embedding = model.model.embed_tokens.weight
    weights = [p for p in model.parameters() if p.dim() == 2 and p is not embedding]
    if model.lm_head.weight is embedding:
        weights.append(embedding)
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, w.shape[1], generator=generator).to(w.dtype) for w in weights]

    def run() -> None:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            for x, w in zip(inputs, weights, strict=True):
                linear.linear_op(x, w, None)

    return run


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from slotwise_engine.bench.decode import measure_read_bandwidth

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    products: dict[str, Any] = {}
    level3: dict[str, Any] = {}
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for rows in args.rows:
            variants, nbytes = product_variants(dtype, rows)
            bandwidth = measure_read_bandwidth(nbytes, device="cpu").bytes_per_second
            medians = interleaved(variants, args.rounds)
            products.setdefault(dtype_name, {})[rows] = {
                "bytes": nbytes,
                "read_bandwidth_gb_s": bandwidth / 1e9,
                "ms": {name: t * 1e3 for name, t in medians.items()},
            }
        if not args.level3:
            continue
        steps, differences, compile_seconds, step_bytes = level3_steps(dtype, threads)
        torch.set_num_threads(threads)
        bandwidth = measure_read_bandwidth(step_bytes, device="cpu").bytes_per_second
        medians = interleaved(steps, args.rounds)
        torch.set_num_threads(threads)
        level3[dtype_name] = {
            "bytes_per_step": step_bytes,
            "read_bandwidth_gb_s": bandwidth / 1e9,
            "roofline_ms": step_bytes / bandwidth * 1e3,
            "p50_ms": {name: t * 1e3 for name, t in medians.items()},
            "max_abs_logit_diff_vs_eager": differences,
            "compile_seconds": compile_seconds,
        }
    return {
        **environment(),
        "torch_threads": threads,
        "load_average": os.getloadavg()[0],
        "rounds": args.rounds,
        "products": products,
        "level3": level3,
        "timestamp": utc_timestamp(),
    }


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"{report['torch_threads']} threads, {report['rounds']} interleaved rounds, load "
        f"average {report['load_average']:.1f} at the end.",
        "",
        "Products of a few rows over the `small` preset's weights (GB/s: the weights' bytes "
        "over the time):",
        "",
        "| dtype | rows | variant | ms | GB/s | vs torch |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for dtype, by_rows in report["products"].items():
        for rows, part in by_rows.items():
            torch_ms = part["ms"]["torch F.linear"]
            for name, ms in part["ms"].items():
                lines.append(
                    f"| {dtype} | {rows} | {name} | {ms:.2f} | {part['bytes'] / ms / 1e6:.1f} "
                    f"| {torch_ms / ms:.2f}x |"
                )
    if report["level3"]:
        lines += [
            "",
            "Level-3 decode steps of the `small` preset at batch 1:",
            "",
            "| dtype | variant | p50 ms | of roofline | vs CPU plugin | max \\|dlogit\\| vs eager "
            "| compile s |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for dtype, part in report["level3"].items():
            plugin_ms = part["p50_ms"][PLUGIN_STEP]
            for name, ms in part["p50_ms"].items():
                if name == PRODUCTS_ALONE:
                    lines += [
                        f"| {dtype} | {name} | {ms:.2f} | | | | |",
                        f"| {dtype} | (the rest of the plugin's step) | {plugin_ms - ms:.2f} "
                        "| | | | |",
                    ]
                    continue
                lines.append(
                    f"| {dtype} | {name} | {ms:.2f} | {part['roofline_ms'] / ms:.2f} "
                    f"| {plugin_ms / ms:.2f}x | {part['max_abs_logit_diff_vs_eager'][name]:.1e} "
                    f"| {part['compile_seconds'][name]:.1f} |"
                )
            lines.append(
                f"| {dtype} | (roofline: {part['bytes_per_step'] / 1e6:.1f} MB at "
                f"{part['read_bandwidth_gb_s']:.1f} GB/s) | {part['roofline_ms']:.2f} | | | | |"
            )
    return "\n".join(lines) + "\n"


def _rows(text: str) -> list[int]:
    try:
        rows = [int(part) for part in text.split(",")]
    except ValueError:
        message = f"{text!r} is not a comma-separated list of rows"
        raise argparse.ArgumentTypeError(message) from None
    if not all(1 <= r <= 16 for r in rows):
        raise argparse.ArgumentTypeError(f"rows must be 1 to 16 (the kernel's limit); got {text}")
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timed rounds")
    add_dtypes_arg(parser, "comma-separated: float32, bfloat16, float16")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--rows", type=_rows, default=[1, 4, 8, 16],
        help="comma-separated rows of input for the products part (1 to 16)",
    )  # fmt: skip
    parser.add_argument(
        "--no-level3", dest="level3", action="store_false",
        help="only the products part (the level-3 part compiles ten models per dtype)",
    )  # fmt: skip
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
    publish("cpu_decode_tuning", report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
