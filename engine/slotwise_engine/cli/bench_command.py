"""``slotwise bench``: decode-step latency of a model, eager against compiled variants."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from slotwise.cli.arguments import MAX_TOKENS, add_tp_argument, int_in, usable_cpus
from slotwise.cli.table import format_table
from slotwise.errors import SlotwiseError

if TYPE_CHECKING:
    from slotwise.compilation.config import CompilationConfig

#: The dtypes --dtype accepts (torch's names).
DTYPES = ("float32", "bfloat16", "float16")
#: Bounds of the counts: far past any useful run, well short of what overflows or
#: allocates without end.
MAX_REPEATS = 1000
MAX_ITERATIONS = 1_000_000
MAX_LAYERS = 1024
MAX_BATCH_SIZE = 65536


class BenchArgumentError(SlotwiseError):
    """An argument only the preset (or checkpoint) can judge; main() reports it like
    argparse (exit 2)."""


def add_parser(commands: Any, name: str) -> None:
    from slotwise.compilation.config import CompilationConfig

    parser = commands.add_parser(
        name,
        help="measure decode-step latency: eager, level 3, level 3 with graphs, torch.compile",
    )
    parser.add_argument(
        "what",
        nargs="?",
        choices=("decode", "startup"),
        default="decode",
        help="decode (default): step latency; startup: fresh processes timed to the first token",
    )
    parser.add_argument(
        "--repeats",
        type=int_in(1, MAX_REPEATS),
        default=3,
        help=f"startup: rounds of processes (1 to {MAX_REPEATS})",
    )
    parser.add_argument(
        "--layers",
        type=int_in(1, MAX_LAYERS),
        default=None,
        help=f"startup with --preset: build the preset with this many layers (1 to {MAX_LAYERS})",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--preset", default="small", help="model preset (tiny, small, 1b: Llama-3.2-1B shapes)"
    )
    source.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="a Hugging Face checkpoint folder to measure instead of a preset",
    )
    parser.add_argument(
        "--batch-sizes",
        type=_sizes,
        default="1,4,16",
        help=f"comma-separated decode batch sizes, each from 1 to {MAX_BATCH_SIZE}",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated subset of: eager, level3, level3+graphs (piecewise), "
        "level3+full_graphs (full graphs for decodes), torch.compile (with the platform's "
        "default compile backend), torch.compile:reduce-overhead (Inductor only) (default: "
        "eager, level3, level3+graphs where the platform has static graphs, torch.compile "
        "where it can compile)",
    )
    parser.add_argument(
        "--prompt-len",
        type=int_in(1, MAX_TOKENS),
        default=32,
        help="tokens cached per request, from 1 to the preset's max_position - 1",
    )
    parser.add_argument(
        "--iterations",
        type=int_in(1, MAX_ITERATIONS),
        default=30,
        help=f"timed steps per variant (1 to {MAX_ITERATIONS})",
    )
    parser.add_argument(
        "--dtype",
        type=_dtypes,
        default="float32",
        help="the weights' dtype: float32, bfloat16 or float16; several, comma-separated "
        "(float32,bfloat16), are measured in one run, their steps interleaved",
    )
    parser.add_argument(
        "--threads",
        type=int_in(1, usable_cpus()),
        default=None,
        help="torch intra-op threads, up to the CPUs this process may use (default: torch's "
        "choice; 1 is steadier on a busy machine)",
    )
    add_tp_argument(parser, "bench")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    CompilationConfig.add_cli_arguments(parser)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or not all(1 <= size <= MAX_BATCH_SIZE for size in sizes):
        raise argparse.ArgumentTypeError(
            f"{text!r} must list integers from 1 to {MAX_BATCH_SIZE}, e.g. 1,4,16"
        )
    return sizes


def _dtypes(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in DTYPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r} must list dtypes among {', '.join(DTYPES)}, e.g. float32,bfloat16"
        )
    return list(dict.fromkeys(names))


def _check_preset(preset: str, model: str | None, prompt_len: int) -> None:
    """The preset exists (or the checkpoint's config.json can be read) and holds a prompt
    of ``prompt_len`` and one decoded token."""
    from slotwise_engine.bench.decode import model_shape
    from slotwise_engine.models.llama import PRESETS

    if model is None and preset not in PRESETS:
        raise BenchArgumentError(
            f"argument --preset: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}"
        )
    limit = model_shape(model or preset).max_position - 1
    if prompt_len > limit:
        raise BenchArgumentError(
            f"argument --prompt-len: {_described(preset, model)} holds prompts of 1 to {limit} "
            f"tokens (and one decoded token), got {prompt_len}"
        )


def _described(preset: str, model: str | None) -> str:
    return f"preset {preset}" if model is None else f"model {model}"


def render(result: dict[str, Any]) -> str:
    header = [
        "variant",
        "dtype",
        "batch",
        "p50 ms",
        "p90 ms",
        "tokens/s",
        "vs eager",
        "MB/step",
        "roofline ms",
        "of roofline",
        "max |dlogit|",
        "vs float32",
        "compile s",
        "capture s",
    ]
    rows = [
        [
            m["variant"],
            m["dtype"],
            str(m["batch_size"]),
            f"{m['p50_ms']:.2f}",
            f"{m['p90_ms']:.2f}",
            f"{m['tokens_per_second']:.0f}",
            f"{m['speedup_vs_eager']:.2f}x",
            f"{m['bytes_per_step'] / 1e6:.1f}",
            f"{m['roofline_ms']:.2f}",
            f"{m['roofline_fraction']:.2f}",
            f"{m['max_abs_logit_diff']:.1e}",
            f"{m['max_abs_logit_diff_vs_float32']:.1e}",
            f"{m['compile_seconds']:.1f}",
            f"{m['capture_seconds']:.2f}",
        ]
        for m in result["measurements"]
    ]
    bandwidth, after = result["read_bandwidth"], result["read_bandwidth_after"]
    load = result["load_average"]
    title = (
        f"slotwise bench: {_described(result['preset'], result['model'])} on "
        f"{result['platform']}, "
        f"tensor parallel {result['tensor_parallel_size']}, torch {result['torch']}, "
        f"{result['iterations']} steps per variant\n"
        f"read bandwidth {bandwidth['bytes_per_second'] / 1e9:.1f} GB/s "
        f"({bandwidth['probe_bytes'] // 2**20} MiB probe, {bandwidth['threads']} threads; "
        f"{after['bytes_per_second'] / 1e9:.1f} GB/s after the steps)"
        + ("" if load is None else f", load average {load[0]:.1f} to {load[1]:.1f}")
    )
    title += "\ndefault graph mode {mode}: {reason}".format_map(result["default_graph_mode"])
    for name, reason in result["skipped_variants"].items():
        title += f"\nvariant {name} skipped: {reason}"
    return title + "\n" + format_table(header, rows)


def run(args: argparse.Namespace) -> int:
    from slotwise.compilation.config import CompilationConfig

    config = CompilationConfig.from_cli_namespace(args)  # checked before torch loads
    _check_preset(args.preset, args.model, args.prompt_len)
    if args.layers is not None and (args.what != "startup" or args.model is not None):
        raise BenchArgumentError(
            "argument --layers: only 'slotwise bench startup --preset NAME' takes it"
        )
    if args.what == "startup":
        return _run_startup(
            args.model or args.preset, args.repeats, config, args.json, layers=args.layers
        )
    import torch

    from slotwise_engine.bench.decode import run_benchmark

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    variants = args.variants.split(",") if args.variants else None
    rank = 0
    if args.tp > 1:
        from slotwise.distributed import init_distributed

        rank = init_distributed(tensor_parallel_size=args.tp).rank
    try:
        result = run_benchmark(
            args.model or args.preset,
            args.batch_sizes,
            config,
            variants=variants,
            prompt_len=args.prompt_len,
            iterations=args.iterations,
            progress=not args.json and rank == 0,
            dtype=[getattr(torch, name) for name in args.dtype],
        ).as_dict()
    except ValueError as exc:
        raise SystemExit(f"slotwise bench: {exc}") from exc
    finally:
        if args.tp > 1:
            from slotwise.distributed import shutdown_distributed

            shutdown_distributed()
    result["tensor_parallel_size"] = args.tp
    if args.model is not None:  # run_benchmark named the folder "preset"
        result["preset"] = None
    result["model"] = args.model
    if rank == 0:
        print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


def _run_startup(
    model: str, repeats: int, config: CompilationConfig, as_json: bool, layers: int | None
) -> int:
    """``slotwise bench startup``: print the medians as a table or one JSON object."""
    from slotwise_engine.bench.startup import run_startup_benchmark

    config_json = json.dumps(config.to_dict())
    result = run_startup_benchmark(model, repeats, config_json, layers=layers, progress=not as_json)
    print(json.dumps(result, indent=2) if as_json else render_startup(result))
    return 0


def render_startup(result: dict[str, Any]) -> str:
    """The table of ``slotwise bench startup``: one row per variant, medians of its rounds."""
    from slotwise_engine.bench.startup import COUNTS, PHASES, VARIANTS

    header = ["variant", "total s", *[f"{p} s" for p in PHASES], "interpreter s", *COUNTS]
    rows = [
        [variant, f"{result[variant]['total_s']:.2f}"]
        + [f"{result[variant][p]:.2f}" for p in PHASES]
        + [f"{result[variant]['interpreter_s']:.2f}"]
        + [f"{result[variant][c]:g}" for c in COUNTS]
        for variant in VARIANTS
    ]
    layers = "" if result["layers"] is None else f" with {result['layers']} layers"
    return (
        f"slotwise bench startup: {result['model']}{layers}, median of {result['repeats']} "
        "rounds\n"
        + format_table(header, rows)
        + f"\nwarm / eager {result['warm_over_eager']:.2f}x, "
        f"warm / cold {result['warm_over_cold']:.2f}x"
    )
