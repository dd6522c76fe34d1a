"""Decode-step latency of a model under several compilation variants: the main job.

Every variant builds the same seeded model (a preset, or the checkpoint folder
passed where a preset's name goes), prefills the same prompts and then
times one decode step (one new token for each of ``batch`` requests) many times.
Ratios are taken within one run, on one machine, with variants interleaved per
batch size so that noise from a shared machine hits them alike.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from slotwise.attention.selector import select_attention_backend
from slotwise.compilation.config import CompilationConfig, GraphMode
from slotwise.compilation.graph_modes import supported_graph_modes
from slotwise.models.llama import PRESETS, LlamaConfig, LlamaForCausalLM, build_llama
from slotwise.platforms import get_current_platform
from slotwise.runner.model_runner import ModelRunner, Request
from slotwise.stats import percentile

logger = logging.getLogger("slotwise")

#: Variant names, in the order they are reported.  "level3+graphs" captures the
#: pieces (PIECEWISE); "level3+full_graphs" also the whole model for decode steps
#: (FULL_AND_PIECEWISE), which needs an attention backend that can be captured.
VARIANTS = (
    "eager",
    "level3",
    "level3+graphs",
    "level3+full_graphs",
    "torch.compile",
    "torch.compile:reduce-overhead",
)
#: What runs when no variant is named: "reduce-overhead" only differs on a GPU.
DEFAULT_VARIANTS = ("eager", "level3", "level3+graphs", "torch.compile")
#: The variants that capture static graphs, with their graph mode.
GRAPH_VARIANTS = {
    "level3+graphs": GraphMode.PIECEWISE,
    "level3+full_graphs": GraphMode.FULL_AND_PIECEWISE,
}


@dataclass
class VariantSetup:
    name: str
    runner: ModelRunner
    compile_seconds: float
    capture_seconds: float


@dataclass
class Measurement:
    variant: str
    batch_size: int
    p50_ms: float
    p90_ms: float
    tokens_per_second: float
    speedup_vs_eager: float | None
    max_abs_logit_diff: float | None
    compile_seconds: float
    capture_seconds: float


@dataclass
class BenchmarkResult:
    preset: str
    platform: str
    torch: str
    config: dict[str, Any]
    prompt_len: int
    iterations: int
    dtype: str
    measurements: list[Measurement] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def variants_for_platform(
    requested: Sequence[str] | None, preset: str, dtype: torch.dtype = torch.float32
) -> list[str]:
    """The requested variants (default: all that make sense on this platform); a graph
    variant needs its graph mode among those the platform and the model's attention
    backend support (``supported_graph_modes``)."""
    platform = get_current_platform()
    names = list(requested or DEFAULT_VARIANTS)
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    shape = model_shape(preset)
    backend = select_attention_backend(
        platform, head_size=shape.head_size, dtype=dtype, block_size=shape.block_size
    )
    supported = supported_graph_modes(platform, backend)
    unsupported = [n for n in names if GRAPH_VARIANTS.get(n, GraphMode.NONE) not in supported]
    if unsupported and requested:
        name = unsupported[0]
        raise ValueError(
            f"variant {name!r} needs static graphs in graph_mode={GRAPH_VARIANTS[name].name}, "
            f"which platform {platform.name} with attention backend {backend.get_name()} "
            "does not support "
            f"(it supports {', '.join(mode.name for mode in supported)}); drop it from --variants"
        )
    return [name for name in names if name not in unsupported]


def model_shape(model: str) -> LlamaConfig:
    """The shape of ``model``: a preset's name, or a checkpoint folder (its config.json)."""
    if model in PRESETS:
        return PRESETS[model]
    from slotwise.models.hf_config import HFConfig
    from slotwise.models.registry import model_class

    hf = HFConfig.read(Path(model))
    return model_class(hf).config_from_hf(hf)


def build_model(
    model: str, *, dtype: torch.dtype, compilation_config: CompilationConfig
) -> LlamaForCausalLM:
    """A preset with seeded random weights, or the checkpoint in folder ``model``."""
    if model in PRESETS:
        return build_llama(
            model,
            seed=0,
            dtype=dtype,
            device=get_current_platform().device_type,
            compilation_config=compilation_config,
        )
    from slotwise.models import load_model

    return load_model(model, dtype=dtype, compilation_config=compilation_config)


def _variant_config(name: str, base: CompilationConfig, batch_sizes: Sequence[int]) -> Any:
    if name == "eager" or name.startswith("torch.compile"):
        return CompilationConfig(level=0)
    graph_mode = GRAPH_VARIANTS.get(name, GraphMode.NONE)
    graphs = graph_mode != GraphMode.NONE
    return base.replace(
        level=3,
        graph_mode=graph_mode,
        **({"capture_sizes": sorted(set(batch_sizes))} if graphs else {}),
    )


def setup_variant(
    name: str,
    preset: str,
    base: CompilationConfig,
    batch_sizes: Sequence[int],
    prompt_len: int,
    *,
    progress: bool,
    dtype: torch.dtype = torch.float32,
) -> VariantSetup:
    """Build, compile (first call) and capture one variant; time both."""
    config = _variant_config(name, base, batch_sizes)
    model = build_model(preset, dtype=dtype, compilation_config=config)
    if name.startswith("torch.compile"):
        mode = name.partition(":")[2] or None
        model.model.forward = torch.compile(model.model.forward, fullgraph=True, mode=mode)
    max_batch = max(batch_sizes)
    blocks_per_request = -(-(prompt_len + 8) // model.config.block_size)
    runner = ModelRunner(model, num_blocks=max_batch * blocks_per_request + 1)
    start = time.perf_counter()
    runner.free(_prefill(runner, 1, prompt_len))  # the first call traces and compiles
    compile_seconds = time.perf_counter() - start
    reports = runner.capture(progress=progress)
    return VariantSetup(name, runner, compile_seconds, sum(r.seconds for r in reports))


def _prompts(batch: int, prompt_len: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(batch)
    return torch.randint(0, vocab, (batch, prompt_len), generator=generator).tolist()


def _prefill(runner: ModelRunner, batch: int, prompt_len: int) -> list[Request]:
    requests = runner.add_requests(
        _prompts(batch, prompt_len, runner.model.config.vocab_size), max_new_tokens=1
    )
    runner.step(requests)
    return requests


@dataclass
class DecodeStep:
    """The same decode step (one new token per request), runnable again and again;
    it rewrites the same cache slots each time."""

    runner: ModelRunner
    requests: list[Request]
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: Any

    @classmethod
    def prepare(cls, runner: ModelRunner, batch: int, prompt_len: int) -> DecodeStep:
        requests = _prefill(runner, batch, prompt_len)
        for request in requests:
            request.tokens.append(1)
        metadata = runner.metadata_builder.build(
            [1] * batch, [r.num_cached for r in requests], [r.block_ids for r in requests]
        )
        input_ids = torch.ones(batch, dtype=torch.long, device=runner.device)
        positions = torch.tensor([r.num_cached for r in requests], device=runner.device)
        return cls(runner, requests, input_ids, positions, metadata)

    def __call__(self) -> torch.Tensor:
        hidden = self.runner.execute(
            self.input_ids, self.positions, self.metadata, uniform_decode=True
        )
        logits = self.runner.model.compute_logits(hidden)
        self.runner.platform.synchronize()
        return logits

    def timed(self) -> float:
        start = time.perf_counter()
        self()
        return time.perf_counter() - start


def run_benchmark(
    preset: str,
    batch_sizes: Sequence[int],
    base: CompilationConfig,
    *,
    variants: Sequence[str] | None = None,
    prompt_len: int = 32,
    iterations: int = 30,
    warmups: int = 5,
    progress: bool = True,
    dtype: torch.dtype = torch.float32,
) -> BenchmarkResult:
    names = variants_for_platform(variants, preset, dtype)
    if "eager" not in names:
        names.insert(0, "eager")  # the reference for speedups and logit differences
    platform = get_current_platform()
    result = BenchmarkResult(
        preset=preset,
        platform=platform.name,
        torch=torch.__version__,
        config=base.to_dict(),
        prompt_len=prompt_len,
        iterations=iterations,
        dtype=str(dtype).removeprefix("torch."),
    )
    setups = []
    for name in names:
        logger.info("setting up %s (building, compiling, capturing)", name)
        setups.append(
            setup_variant(
                name, preset, base, batch_sizes, prompt_len, progress=progress, dtype=dtype
            )
        )
    for batch in batch_sizes:
        steps = {
            setup.name: DecodeStep.prepare(setup.runner, batch, prompt_len) for setup in setups
        }
        logits = {name: step().float() for name, step in steps.items()}
        for step in steps.values():
            for _ in range(warmups):
                step()
        samples: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(iterations):  # interleaved: noise hits every variant alike
            for name, step in steps.items():
                samples[name].append(step.timed())
        eager_p50 = statistics.median(samples["eager"])
        for setup in setups:
            p50 = statistics.median(samples[setup.name])
            result.measurements.append(
                Measurement(
                    variant=setup.name,
                    batch_size=batch,
                    p50_ms=p50 * 1e3,
                    p90_ms=percentile(samples[setup.name], 90) * 1e3,
                    tokens_per_second=batch / p50,
                    speedup_vs_eager=eager_p50 / p50,
                    max_abs_logit_diff=(logits[setup.name] - logits["eager"]).abs().max().item(),
                    compile_seconds=setup.compile_seconds,
                    capture_seconds=setup.capture_seconds,
                )
            )
        for step in steps.values():
            step.runner.free(step.requests)
    return result
