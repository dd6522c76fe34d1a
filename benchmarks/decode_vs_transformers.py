"""Decode-step latency of one checkpoint: slotwise against Hugging Face transformers.

Why: loading Hugging Face checkpoints is only worth it if slotwise then runs them
faster than transformers does.  The script saves a random Llama checkpoint at run
time with transformers (default: hidden 512, 8 layers, 8 query and 4 key/value
heads, vocabulary 8192, float32: the shape of the ``small`` preset) and times, in
one process, one decode step (one new token for each of ``batch`` requests whose
prompts are already cached) of four variants, each in every dtype of ``--dtypes``
(default float32 and bfloat16, the checkpoint's weights cast on loading):

* ``transformers eager``: ``AutoModelForCausalLM`` with its dynamic cache (the cache
  is cropped back by one token between steps, untimed);
* ``transformers compile+static``: the same with a ``StaticCache`` and its forward
  under ``torch.compile(fullgraph=True)`` with the platform's default compile backend,
  transformers' fastest path;
* ``slotwise eager``: ``load_model`` at level 0 and ``ModelRunner.step``;
* ``slotwise level3``: the same at level 3 (piecewise, the platform's compile backend).

All run on the current platform's device.  Each step goes through the public entry point
(``model(...)``, ``runner.step(...)``), so slotwise's attention metadata and
transformers' masks are both paid.  Variants (of
all dtypes) are interleaved step by step, each timed step right after an untimed one of
the same variant (one that followed another model's step would find the caches full of
that model's state, which no server sees).  "setup s" is the prefill and the first step
of each row, where the compiled variants compile (untimed), and that step's logits are
compared with transformers eager's in float32.  Target: slotwise level 3 at least 2x
transformers' fastest variant in the same dtype at batch 1.

Results go to ``<out-dir>/decode_vs_transformers.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    LOG,
    add_dtypes_arg,
    add_output_args,
    configure_logging,
    environment,
    package_version,
    publish,
    seconds_of,
    utc_timestamp,
    verdict,
)

from slotwise.stats import interleaved_timings, percentile

TARGET_RATIO = 2.0
PROMPT_LEN = 32

#: A decode step, ready to run again and again: ``reset`` (untimed) puts the cache back
#: where the step expects it, ``step`` runs it and returns the logits [batch, vocab].
Step = tuple[Callable[[], None], Callable[[], Any]]


def write_checkpoint(folder: Path, args: argparse.Namespace) -> None:
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden_size // 64,
        num_key_value_heads=args.hidden_size // 128,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def back_to_prompt(cache: Any) -> None:
    """Drop the token the last step added to a transformers cache (dynamic or static:
    a static one counts its length too)."""
    if cache.get_seq_length() > PROMPT_LEN:
        cache.crop(-1)


def platform_device() -> Any:
    """The current platform's device, where slotwise runs and transformers is put too."""
    import torch

    from slotwise.platforms import current_platform

    return torch.device(current_platform.device_type)


def transformers_eager(folder: Path, dtype: Any) -> Callable[[Any], Step]:
    import torch
    import transformers

    device = platform_device()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = model.to(device).eval()

    def prepare(prompts: Any) -> Step:
        prompts = prompts.to(device)
        cache = transformers.DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=prompts, past_key_values=cache, use_cache=True)
        token = torch.ones(prompts.shape[0], 1, dtype=torch.long, device=device)

        def step() -> Any:
            with torch.inference_mode():
                return model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]

        return lambda: back_to_prompt(cache), step

    return prepare


def transformers_compiled(folder: Path, dtype: Any) -> Callable[[Any], Step]:
    import torch
    import transformers

    from slotwise_engine.bench.decode import torch_compile_options

    device = platform_device()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = model.to(device).eval()
    compiled = torch.compile(model.forward, fullgraph=True, **torch_compile_options())

    def prepare(prompts: Any) -> Step:
        prompts = prompts.to(device)
        batch = prompts.shape[0]
        cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT_LEN + 1)
        with torch.inference_mode():
            model(
                input_ids=prompts,
                past_key_values=cache,
                cache_position=torch.arange(PROMPT_LEN, device=device),
                use_cache=True,
            )
        token = torch.ones(batch, 1, dtype=torch.long, device=device)
        position = torch.tensor([PROMPT_LEN], device=device)

        def step() -> Any:
            with torch.inference_mode():
                return compiled(
                    input_ids=token,
                    past_key_values=cache,
                    cache_position=position,
                    position_ids=position.expand(batch, 1),
                    use_cache=True,
                ).logits[:, -1]

        return lambda: back_to_prompt(cache), step

    return prepare


def slotwise_runner(folder: Path, level: int, dtype: Any) -> Callable[[Any], Step]:
    from slotwise_engine.models import load_model
    from slotwise_engine.runner.model_runner import ModelRunner

    model = load_model(folder, dtype=dtype, compilation_config={"level": level})
    runner = ModelRunner(model, num_blocks=64)

    def prepare(prompts: Any) -> Step:
        requests = runner.add_requests(prompts.tolist(), max_new_tokens=1)
        runner.step(requests)  # the prefill
        for request in requests:
            request.tokens.append(1)

        def reset() -> None:  # the step recomputes the new token in place
            for request in requests:
                request.num_cached = PROMPT_LEN

        return reset, lambda: runner.step(requests)

    return prepare


def variants(
    folder: Path, dtypes: list[str], skip: set[str]
) -> tuple[dict[str, Callable[[Any], Step]], dict[str, str]]:
    """The variants that could be built, named "<variant>, <dtype>", and why the others
    could not."""
    import torch

    builders = {
        "transformers eager": lambda dtype: transformers_eager(folder, dtype),
        "transformers compile+static": lambda dtype: transformers_compiled(folder, dtype),
        "slotwise eager": lambda dtype: slotwise_runner(folder, 0, dtype),
        "slotwise level3": lambda dtype: slotwise_runner(folder, 3, dtype),
    }
    built, failed = {}, {}
    for dtype in dtypes:
        for name, build in builders.items():
            key = f"{name}, {dtype}"
            if name in skip:
                failed[key] = "skipped (--skip)"
                continue
            try:
                built[key] = build(getattr(torch, dtype))
            except Exception as exc:  # noqa: BLE001 - recorded in the report, not hidden
                failed[key] = f"{type(exc).__name__}: {exc}"
    return built, failed


def measure(
    prepares: dict[str, Callable[[Any], Step]],
    failed: dict[str, str],
    batch: int,
    args: argparse.Namespace,
) -> dict[str, dict[str, float]]:
    """One row per variant at ``batch``: setup time, logit difference to
    transformers eager, and the timed steps, interleaved."""
    import torch

    generator = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, args.vocab_size, (batch, PROMPT_LEN), generator=generator)
    steps, rows, logits = {}, {}, {}
    for name, prepare in prepares.items():
        if name in failed:
            continue
        try:
            start = time.perf_counter()
            reset, step = steps[name] = prepare(prompts)
            reset()
            logits[name] = step().float()
            rows[name] = {"setup_s": round(time.perf_counter() - start, 2)}
            LOG.info("batch %d: %s ready in %.1f s", batch, name, rows[name]["setup_s"])
        except Exception as exc:  # noqa: BLE001 - e.g. a compile that fails on this machine
            failed[name] = f"{type(exc).__name__}: {exc}"
            steps.pop(name, None)
    # Each step's cache is put back first, untimed.
    timers = {
        name: functools.partial(seconds_of, step, before=reset)
        for name, (reset, step) in steps.items()
    }
    samples = interleaved_timings(timers, args.iterations, warmups=args.warmups)
    reference = logits.get("transformers eager, float32")
    for name, times in samples.items():
        p50 = statistics.median(times)
        rows[name].update(
            p50_ms=round(p50 * 1e3, 3),
            p90_ms=round(percentile(times, 90) * 1e3, 3),
            tokens_per_second=round(batch / p50, 1),
            max_abs_logit_diff=None
            if reference is None
            else float((logits[name] - reference).abs().max()),
        )
    return rows


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    import os

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="slotwise-vs-hf-") as tmp:
        folder = Path(tmp)
        LOG.info("writing the checkpoint")
        write_checkpoint(folder, args)
        prepares, failed = variants(folder, args.dtypes, set(args.skip))
        results = {batch: measure(prepares, failed, batch, args) for batch in args.batch_sizes}
    ratios: dict[str, dict[str, float]] = {}
    for batch, rows in results.items():
        for dtype in args.dtypes:
            theirs = [
                rows[n]["p50_ms"] for n in rows if n.startswith("transformers") and dtype in n
            ]
            ours = rows.get(f"slotwise level3, {dtype}")
            if ours and theirs:
                ratios.setdefault(dtype, {})[str(batch)] = round(min(theirs) / ours["p50_ms"], 3)
    first = str(args.batch_sizes[0])
    return {
        **environment(),
        "transformers_version": package_version("transformers"),
        "torch_threads": torch.get_num_threads(),
        "load_average": [load_before, os.getloadavg()[0]],
        "checkpoint": {
            "hidden_size": args.hidden_size,
            "intermediate_size": args.intermediate_size,
            "layers": args.layers,
            "vocab_size": args.vocab_size,
            "dtype": "float32",
            "prompt_len": PROMPT_LEN,
        },
        "dtypes": args.dtypes,
        "iterations": args.iterations,
        "results": {str(batch): rows for batch, rows in results.items()},
        "failed": failed,
        "level3_vs_fastest_transformers": ratios,
        "target_ratio": TARGET_RATIO,
        "meets_target": {
            dtype: by_batch.get(first, 0.0) >= TARGET_RATIO for dtype, by_batch in ratios.items()
        },
        "timestamp": utc_timestamp(),
    }


def render_markdown(report: dict[str, Any]) -> str:
    checkpoint = report["checkpoint"]
    load = report["load_average"]
    lines = [
        f"Checkpoint: random Llama, hidden {checkpoint['hidden_size']}, {checkpoint['layers']} "
        f"layers, vocabulary {checkpoint['vocab_size']}, saved in float32 and run in "
        f"{' and '.join(report['dtypes'])}, {checkpoint['prompt_len']}-token prompts; "
        f"{report['iterations']} steps per row, {report['torch_threads']} threads, load "
        f"average {load[0]:.1f} to {load[1]:.1f}, transformers "
        f"{report['transformers_version']}, torch {report['torch_version']}.",
        "",
        "| variant | dtype | batch | p50 ms | p90 ms | tokens/s | setup s "
        "| max \\|dlogit\\| vs float32 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for batch, rows in report["results"].items():
        for key, r in rows.items():
            name, dtype = key.rsplit(", ", 1)
            diff = "-" if r["max_abs_logit_diff"] is None else f"{r['max_abs_logit_diff']:.1e}"
            lines.append(
                f"| {name} | {dtype} | {batch} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} "
                f"| {r['tokens_per_second']:.0f} | {r['setup_s']:.1f} | {diff} |"
            )
    lines.append("")
    for name, reason in report["failed"].items():
        lines.append(f"- {name}: not measured: {reason}")
    for dtype, by_batch in report["level3_vs_fastest_transformers"].items():
        for batch, ratio in by_batch.items():
            lines.append(
                f"- slotwise level3 vs the fastest transformers variant, {dtype}, batch "
                f"{batch}: {ratio:.2f}x"
            )
    lines.append("")
    for dtype, met in report["meets_target"].items():
        lines.append(
            f"Target: slotwise level3 >= {report['target_ratio']}x the fastest transformers "
            f"variant at batch 1, {dtype}: **{verdict(met)}**"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch-sizes", type=lambda t: [int(b) for b in t.split(",")], default=[1, 8]
    )
    parser.add_argument("--iterations", type=int, default=30, help="timed steps per row")
    parser.add_argument("--warmups", type=int, default=5)
    parser.add_argument("--hidden-size", type=int, default=512, help="a multiple of 128")
    parser.add_argument("--intermediate-size", type=int, default=1376)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    add_dtypes_arg(
        parser, "comma-separated dtypes to run the checkpoint in: float32, bfloat16, float16"
    )
    parser.add_argument(
        "--skip", action="append", default=[], metavar="VARIANT", help="a variant not to run"
    )
    add_output_args(parser)
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmups < 0 or min(args.batch_sizes) < 1:
        parser.error("--iterations and --batch-sizes must be at least 1, --warmups at least 0")
    if args.hidden_size % 128:
        parser.error("--hidden-size must be a multiple of 128 (64-wide heads, 2 per KV head)")
    return args


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    args = parse_args(argv)
    report = build_report(args)
    markdown = render_markdown(report)
    publish("decode_vs_transformers", report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
