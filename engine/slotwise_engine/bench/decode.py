"""Decode-step latency of a model under several compilation variants: the main job.

Every variant builds the same seeded model (a preset, or the checkpoint folder
passed where a preset's name goes), prefills the same prompts and then
times one decode step (one new token for each of ``batch`` requests) many times.
Ratios are taken within one run, on one machine, with variants (and dtypes)
interleaved per batch size so that noise from a shared machine hits them alike, each
timed step right after an untimed step of the same model, as in a server
(``slotwise.stats.interleaved_timings`` says why).

Each measurement is also set against the memory roofline: a decode step must read
every weight and each request's cached keys and values once, so it can take no less
than those bytes over the device's read bandwidth, which a short probe measures
before the timed steps (on the CPU with the run's thread count; on a CUDA GPU a read
of device memory timed by CUDA events).

The result also names the graph mode a config without one gets for the model's
attention backend, and why (``graph_modes.default_graph_mode``): the variant a user
gets by default is that mode's (``DEFAULT_MODE_VARIANTS``).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from slotwise.attention.layer import Attention
from slotwise.attention.selector import select_attention_backend
from slotwise.compilation.compiled_forward import torch_compile_disabled
from slotwise.compilation.compilers import check_inductor_targets, make_compiler
from slotwise.compilation.config import CompilationConfig, ConfigError, GraphMode
from slotwise.compilation.splitting.dynamo_backends import as_is_backend
from slotwise.compilation.static_graphs.graph_modes import default_graph_mode, supported_graph_modes
from slotwise.platforms import get_current_platform
from slotwise.stats import interleaved_timings, percentile
from slotwise_engine.models.llama import PRESETS, LlamaConfig, LlamaForCausalLM, build_llama
from slotwise_engine.runner.model_runner import ModelRunner, Request

logger = logging.getLogger(__name__)

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
#: The variants that run the model under plain torch.compile, with the platform's
#: default compile backend, and the torch.compile mode of each.
TORCH_COMPILE_VARIANTS = {"torch.compile": None, "torch.compile:reduce-overhead": "reduce-overhead"}
#: The variants that capture static graphs, with their graph mode.
GRAPH_VARIANTS = {
    "level3+graphs": GraphMode.PIECEWISE,
    "level3+full_graphs": GraphMode.FULL_AND_PIECEWISE,
}
#: The variant that runs as a level-3 model does with each default graph mode.
DEFAULT_MODE_VARIANTS = {
    GraphMode.NONE: "level3",
    **{mode: name for name, mode in GRAPH_VARIANTS.items()},
}
#: The bandwidth probe reads a buffer as large as the largest step of the run, and at
#: least PROBE_MIN_BYTES, more than the last-level cache of the CPUs slotwise runs on: the
#: roofline is memory's, so a step whose bytes stay in a cache can beat it (a fraction
#: above 1 says so).  Above PROBE_MAX_BYTES a probe would only cost memory and time.
PROBE_MIN_BYTES = 256 * 2**20
PROBE_MAX_BYTES = 2**30
#: The bounds on a CUDA GPU: a read of several GB, far past the L2 cache (50 MB on an
#: H100), as long as a 1B model's weights; a kernel reading it takes about a millisecond.
CUDA_PROBE_MIN_BYTES = 2 * 2**30
CUDA_PROBE_MAX_BYTES = 4 * 2**30
PROBE_REPEATS = 20

#: Seconds that one call of its argument keeps the device busy (see ``device_timer``).
DeviceTimer = Callable[[Callable[[], object]], float]
#: What the benchmark asks for the read bandwidth of a step of that many bytes.
ReadProbe = Callable[[int], "ReadBandwidth"]


@dataclass
class VariantSetup:
    name: str
    runner: ModelRunner
    compile_seconds: float
    capture_seconds: float
    dtype: torch.dtype = torch.float32


@dataclass
class Measurement:
    variant: str
    batch_size: int
    p50_ms: float
    p90_ms: float
    tokens_per_second: float
    speedup_vs_eager: float | None
    #: Against eager in the same dtype: what compilation changes.
    max_abs_logit_diff: float | None
    compile_seconds: float
    capture_seconds: float
    dtype: str = "float32"
    #: Against eager in float32: what the dtype costs in precision.
    max_abs_logit_diff_vs_float32: float | None = None
    #: Weights plus keys and values one step reads (see ``bytes_per_step``).
    bytes_per_step: int = 0
    #: ``bytes_per_step`` over the probed read bandwidth: the fastest the step can be.
    roofline_ms: float = 0.0
    #: ``roofline_ms / p50_ms``: 1.0 would be a step at the memory roofline.
    roofline_fraction: float = 0.0


@dataclass
class ReadBandwidth:
    """What the probe measured: the median rate of reading ``probe_bytes`` once."""

    bytes_per_second: float
    probe_bytes: int
    threads: int


@dataclass
class BenchmarkResult:
    preset: str
    platform: str
    torch: str
    config: dict[str, Any]
    prompt_len: int
    iterations: int
    #: The dtypes measured, comma-separated in the order given.
    dtype: str
    measurements: list[Measurement] = field(default_factory=list)
    #: The graph mode a config without one gets here, and why (``mode``, ``reason``),
    #: and the variant that measures it (``variant``).
    default_graph_mode: dict[str, str] = field(default_factory=dict)
    read_bandwidth: ReadBandwidth | None = None
    #: The same probe again after the last timed step: where a shared machine's memory
    #: got faster or slower during the run, the two differ and the roofline (from the
    #: first) is only as good as that difference says.
    read_bandwidth_after: ReadBandwidth | None = None
    #: The 1-minute load average before and after the run (None where the OS has none):
    #: other processes on the machine slow single steps down.
    load_average: list[float] | None = None
    #: Default variants that cannot run here, each with the reason (``unavailable_variants``).
    skipped_variants: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def variants_for_platform(
    requested: Sequence[str] | None, preset: str, dtype: torch.dtype = torch.float32
) -> list[str]:
    """The requested variants (default: all that make sense on this platform); a graph
    variant needs its graph mode among those the platform and the model's attention
    backend support (``supported_graph_modes``); a torch.compile variant, a compiler
    (``unavailable_variants``)."""
    platform = get_current_platform()
    names = list(requested or DEFAULT_VARIANTS)
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    unavailable = unavailable_variants(names)
    if unavailable and requested:
        name, reason = next(iter(unavailable.items()))
        raise ValueError(f"variant {name!r} cannot run here: {reason}; drop it from --variants")
    names = [name for name in names if name not in unavailable]
    backend = attention_backend_of(preset, dtype)
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


def unavailable_variants(names: Sequence[str]) -> dict[str, str]:
    """Why each torch.compile variant among ``names`` cannot run here: torch.compile is
    switched off (``TORCH_COMPILE_DISABLE=1``), or the platform's default compile backend,
    which the variant compiles with, cannot serve it (Inductor without a code generator
    for the device; a torch.compile mode, which is Inductor's, with another compiler)."""
    platform = get_current_platform()
    backend = platform.default_compile_backend
    reasons = {}
    for name in names:
        if name not in TORCH_COMPILE_VARIANTS:
            continue
        mode = TORCH_COMPILE_VARIANTS[name]
        if torch_compile_disabled():
            reasons[name] = "TORCH_COMPILE_DISABLE=1 switches torch.compile off"
        elif mode is not None and backend != "inductor":
            reasons[name] = (
                f"mode {mode!r} is Inductor's, and platform {platform.name} compiles with its "
                f"default backend {backend!r}"
            )
        elif backend == "inductor":
            try:
                check_inductor_targets(platform)
            except ConfigError as error:
                reasons[name] = str(error)
    return reasons


def check_compiler(base: CompilationConfig) -> None:
    """Make the compiler of the level-3 variants once, before any model is built: a
    backend that cannot work here (Inductor on a device it has no code generator for)
    is refused with one ConfigError, and Inductor's cache folder is placed before
    anything else imports Inductor. Under ``TORCH_COMPILE_DISABLE=1`` they compile
    nothing."""
    if torch_compile_disabled():
        return
    platform = get_current_platform()
    config = base.replace(level=3)
    platform.check_and_update_config(config)
    make_compiler(config.backend or platform.default_compile_backend, config)


def attention_backend_of(model: str, dtype: torch.dtype) -> type:
    """The attention backend the layers of ``model`` in ``dtype`` get on this platform."""
    shape = model_shape(model)
    return select_attention_backend(
        get_current_platform(), head_size=shape.head_size, dtype=dtype, block_size=shape.block_size
    )


def default_mode_of(model: str, dtype: torch.dtype) -> dict[str, str]:
    """The graph mode a level-3 config without one gets for ``model`` in ``dtype`` here,
    why, and the variant that runs as it does."""
    choice = default_graph_mode(get_current_platform(), [attention_backend_of(model, dtype)])
    return {**choice.as_dict(), "variant": DEFAULT_MODE_VARIANTS[choice.mode]}


def model_shape(model: str) -> LlamaConfig:
    """The shape of ``model``: a preset's name, or a checkpoint folder (its config.json)."""
    if model in PRESETS:
        return PRESETS[model]
    from slotwise_engine.models.hf_config import HFConfig
    from slotwise_engine.models.registry import model_class

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
    from slotwise_engine.models import load_model

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
    if name in TORCH_COMPILE_VARIANTS:
        model.model.forward = torch.compile(
            model.model.forward,
            fullgraph=True,
            **torch_compile_options(TORCH_COMPILE_VARIANTS[name]),
        )
    max_batch = max(batch_sizes)
    blocks_per_request = -(-(prompt_len + 8) // model.config.block_size)
    runner = ModelRunner(model, num_blocks=max_batch * blocks_per_request + 1)
    start = time.perf_counter()
    runner.free(_prefill(runner, 1, prompt_len))  # the first call traces and compiles
    compile_seconds = time.perf_counter() - start
    reports = runner.capture(progress=progress)
    return VariantSetup(name, runner, compile_seconds, sum(r.seconds for r in reports), dtype)


def torch_compile_options(mode: str | None = None) -> dict[str, Any]:
    """torch.compile's ``backend`` (and ``mode``, Inductor's) as the platform compiles:
    its default compile backend, a plugin's Compiler as level 1 runs it."""
    backend = get_current_platform().default_compile_backend
    if backend in ("eager", "inductor"):
        return {"backend": backend, "mode": mode}
    return {"backend": as_is_backend(CompilationConfig(level=1, backend=backend))}


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

    @property
    def bytes_read(self) -> int:
        return bytes_per_step(self.runner.model, [len(r.tokens) for r in self.requests])


def bytes_per_step(model: LlamaForCausalLM, seq_lens: Sequence[int]) -> int:
    """The bytes a decode step of requests holding ``seq_lens`` tokens (the new one
    included) must read: every weight once, except that of the embedding table only
    the rows of the step's tokens are read (all of it when the LM head shares it), and
    each request's keys and values in every attention layer.

    This is the least a step reads, whatever its kernels do; activations are left out
    (kilobytes at decode sizes).  Under tensor parallelism it is this rank's share.
    """
    embedding = model.model.embed_tokens.weight
    unique = {id(p): p for p in model.parameters()}
    weights = sum(p.numel() * p.element_size() for p in unique.values())
    if model.lm_head.weight is not embedding:
        weights -= embedding.numel() * embedding.element_size()
        weights += len(seq_lens) * embedding.shape[1] * embedding.element_size()
    tokens = sum(seq_lens)
    kv = 0
    for layer in model.modules():
        if isinstance(layer, Attention) and layer.kv_cache is not None:
            per_token = 2 * layer.num_kv_heads * layer.head_size * layer.kv_cache.element_size()
            kv += tokens * per_token
    return weights + kv


def device_timer(device: torch.device | str) -> DeviceTimer:
    """How ``measure_read_bandwidth`` times a read on ``device``: CUDA events on a CUDA
    GPU, the device's own clock, which leaves out the host's launch and wait; elsewhere
    the host's clock around the call and ``Platform.synchronize``."""
    if torch.device(device).type == "cuda":
        return _cuda_event_seconds
    platform = get_current_platform()

    def host_seconds(work: Callable[[], object]) -> float:
        start = time.perf_counter()
        work()
        platform.synchronize()
        return time.perf_counter() - start

    return host_seconds


def _cuda_event_seconds(work: Callable[[], object]) -> float:
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def probe_bounds(device: torch.device | str) -> tuple[int, int]:
    """The least and most bytes the bandwidth probe reads on ``device``."""
    if torch.device(device).type == "cuda":
        return CUDA_PROBE_MIN_BYTES, CUDA_PROBE_MAX_BYTES
    return PROBE_MIN_BYTES, PROBE_MAX_BYTES


def measure_read_bandwidth(
    nbytes: int,
    *,
    device: torch.device | str,
    repeats: int = PROBE_REPEATS,
    timer: DeviceTimer | None = None,
) -> ReadBandwidth:
    """The median rate at which ``device`` reads ``nbytes`` (clamped to
    ``probe_bounds``) from memory, with torch's current thread count: a float32 sum over
    a buffer, a reduction that memory, not arithmetic, limits on CPUs and GPUs alike.
    ``timer`` (default ``device_timer(device)``) times one sum."""
    low, high = probe_bounds(device)
    nbytes = max(low, min(high, nbytes))
    timer = timer or device_timer(device)
    platform = get_current_platform()
    buffer = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    # Mapped as the weights a step reads are; advised before it is written, when the
    # platform has nothing to move yet.
    platform.advise_resident_memory([buffer])
    buffer.fill_(1.0)
    for _ in range(2):  # first touches and kernel selection stay out of the timing
        buffer.sum()
    platform.synchronize()
    times = [timer(buffer.sum) for _ in range(repeats)]
    rate = buffer.numel() * 4 / statistics.median(times)
    return ReadBandwidth(bytes_per_second=rate, probe_bytes=nbytes, threads=torch.get_num_threads())


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not every OS keeps one
        return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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
    dtype: torch.dtype | Sequence[torch.dtype] = torch.float32,
    read_probe: ReadProbe | None = None,
    float32_reference: bool = True,
    on_setup: Callable[[VariantSetup], object] | None = None,
) -> BenchmarkResult:
    """Measure every variant in every dtype of ``dtype`` (one, or several compared
    within the run) at each batch size; the steps of all of them are interleaved, each
    timed one after an untimed step of its own.

    ``read_probe(nbytes)`` measures the read bandwidth the rooflines divide by, before
    the first timed step and after the last (default: ``measure_read_bandwidth`` on the
    platform's device).  Without ``float32_reference`` no float32 model is built when
    no dtype measured is float32 (a large model's costs memory and set-up time), and
    ``max_abs_logit_diff_vs_float32`` stays None.  ``on_setup`` gets each measured
    variant once it is set up (a caller that times more of it keeps it)."""
    dtypes = [dtype] if isinstance(dtype, torch.dtype) else list(dict.fromkeys(dtype))
    if any(name in GRAPH_VARIANTS or name == "level3" for name in variants or DEFAULT_VARIANTS):
        check_compiler(base)
    # A default variant that some dtype cannot run (a graph mode its attention backend
    # lacks) is left out for all, so every dtype measures the same variants.
    per_dtype = [variants_for_platform(variants, preset, each) for each in dtypes]
    names = [name for name in per_dtype[0] if all(name in other for other in per_dtype)]
    if "eager" not in names:
        names.insert(0, "eager")  # the reference for speedups and logit differences
    platform = get_current_platform()
    if read_probe is None:

        def read_probe(nbytes: int) -> ReadBandwidth:
            return measure_read_bandwidth(nbytes, device=platform.device_type)

    result = BenchmarkResult(
        preset=preset,
        platform=platform.name,
        torch=torch.__version__,
        config=base.to_dict(),
        prompt_len=prompt_len,
        iterations=iterations,
        dtype=",".join(_dtype_name(each) for each in dtypes),
        default_graph_mode=default_mode_of(preset, dtypes[0]),
        # Requested variants that cannot run stopped variants_for_platform already.
        skipped_variants={} if variants else unavailable_variants(DEFAULT_VARIANTS),
    )
    for name, reason in result.skipped_variants.items():
        logger.warning("variant %s is skipped: %s", name, reason)
    logger.info(
        "default graph mode %s (variant %s): %s",
        result.default_graph_mode["mode"],
        result.default_graph_mode["variant"],
        result.default_graph_mode["reason"],
    )
    start_load = _load_average()
    setups = []
    for each in dtypes:
        for name in names:
            logger.info("setting up %s in %s (building, compiling, capturing)", name, each)
            setups.append(
                setup_variant(
                    name, preset, base, batch_sizes, prompt_len, progress=progress, dtype=each
                )
            )
            if on_setup is not None:
                on_setup(setups[-1])
    # The float32 reference of the logits; built only when no float32 variant runs.
    reference = None
    if torch.float32 not in dtypes and float32_reference:
        logger.info("setting up the float32 eager reference (untimed)")
        reference = setup_variant(
            "eager", preset, base, batch_sizes, prompt_len, progress=False, dtype=torch.float32
        )
    bandwidth = None
    largest = max(
        bytes_per_step(s.runner.model, [prompt_len + 1] * max(batch_sizes)) for s in setups
    )
    for batch in batch_sizes:
        steps = {
            (setup.dtype, setup.name): DecodeStep.prepare(setup.runner, batch, prompt_len)
            for setup in setups
        }
        logits = {key: step().float() for key, step in steps.items()}
        if reference is None:
            float32_logits = logits.get((torch.float32, "eager"))
        else:
            reference_step = DecodeStep.prepare(reference.runner, batch, prompt_len)
            float32_logits = reference_step().float()
            reference.runner.free(reference_step.requests)
        step_bytes = {key: step.bytes_read for key, step in steps.items()}
        if bandwidth is None:  # once, before the first timed step, sized to the largest
            bandwidth = read_probe(largest)
            result.read_bandwidth = bandwidth
            logger.info(
                "read bandwidth %.1f GB/s (%d MB probe, %d threads)",
                bandwidth.bytes_per_second / 1e9,
                bandwidth.probe_bytes // 2**20,
                bandwidth.threads,
            )
        samples = interleaved_timings(
            {key: step.timed for key, step in steps.items()}, iterations, warmups=warmups
        )
        for setup in setups:
            key = (setup.dtype, setup.name)
            p50 = statistics.median(samples[key])
            eager_p50 = statistics.median(samples[(setup.dtype, "eager")])
            roofline = step_bytes[key] / bandwidth.bytes_per_second
            result.measurements.append(
                Measurement(
                    variant=setup.name,
                    batch_size=batch,
                    p50_ms=p50 * 1e3,
                    p90_ms=percentile(samples[key], 90) * 1e3,
                    tokens_per_second=batch / p50,
                    speedup_vs_eager=eager_p50 / p50,
                    max_abs_logit_diff=_max_diff(logits[key], logits[(setup.dtype, "eager")]),
                    compile_seconds=setup.compile_seconds,
                    capture_seconds=setup.capture_seconds,
                    dtype=_dtype_name(setup.dtype),
                    max_abs_logit_diff_vs_float32=None
                    if float32_logits is None
                    else _max_diff(logits[key], float32_logits),
                    bytes_per_step=step_bytes[key],
                    roofline_ms=roofline * 1e3,
                    roofline_fraction=roofline / p50,
                )
            )
        for step in steps.values():
            step.runner.free(step.requests)
    result.read_bandwidth_after = read_probe(largest)
    logger.info(
        "read bandwidth after the timed steps %.1f GB/s",
        result.read_bandwidth_after.bytes_per_second / 1e9,
    )
    result.load_average = None if start_load is None else [start_load, _load_average()]
    return result


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()
