"""Measure the host work of one graph-replaying decode step, phase by phase, against a bare loop.

Why: on a GPU a small model's decode step is bound by the host: every microsecond of
Python between two graph replays is a microsecond the device waits.  On the CPU this
benchmark removes the device work and keeps the host work: the real decode path
(``ModelRunner.step`` -> the level-3 model -> its pieces -> the attention op ->
sampling) runs with piecewise graphs on a null ``GraphAPI`` (a capture runs the piece
once, the replay right after it, which slotwise checks, runs it again; later replays
launch nothing and leave the captured outputs) and with the ``TRITON_PAGED`` backend's
kernel launches replaced by nothing (its Python, the KV write and the argument checks
still run).  The LM head's product, a kernel outside the graphs, is replaced by a fixed
logits buffer; the greedy argmax over it still runs.

``--graph-mode FULL_AND_PIECEWISE`` times uniform decode steps, which replay one graph
of the whole model (attention inside it) after the runner wrote the step's attention
metadata, padded, into the persistent buffers the graph reads.

The reference, timed in the same run, step for step in turn with the slotwise step, is
a hand-written loop that makes the same replay and launch calls and nothing else: the
copy of the step's token ids and positions into the static input buffers, then under
PIECEWISE the replay of every piece's graph, per layer the KV-cache write of the step's
new keys and values (one copy each) and the attention-kernel launch with the arguments
the step's own launch had; under FULL_AND_PIECEWISE the copy of what a decode step
changes in the static attention metadata (sequence lengths, slot mapping) and the one
replay; then the logits and the argmax.  ``--batch`` requests decode in each step.

Phases (exclusive time, from a separate instrumented run; the instrumentation itself
adds ``probe_us_per_step``): the runner's input preparation (batch order, dispatch,
forward context), its writes into the persistent step inputs (token ids, positions,
metadata arrays), their upload to the device and its metadata build (views of them;
under FULL_AND_PIECEWISE the static layout's padding), the model call (forward context,
module calls), the model entry (the direct entry and the split graph's forward), or, once
a decode step of the size is recorded, the recorded step's own calls; the graph wrappers
(each piece's, or the whole model's), the graph replays, the attention op where the step
is not recorded (the split graph's direct call into it and its body, measured by calling
it alone; a recorded step calls what each layer's backend bound, past the op), the
backend's lookup of its bound calls and their binding with its tensor checks (both
only where the step's metadata or tensors are new), the KV write (the layer's bound
calls, less the launch) and the kernel launch, and sampling.

``--device cuda`` runs the same step and reference in bfloat16 (``--dtype``) with the
platform's real CUDA graphs, Triton kernels (launched bound, as the backend launches
them) and the real LM head (``--lm-head``; both can be chosen on the CPU too, which
checks that path without a GPU): host time per step
until the step returns (the device is synchronised outside the timed call), device time
per step from CUDA events, and kernel launches per step from torch.profiler.
``--profile`` adds a cProfile of the step. Results go to
``<out-dir>/<name>.json`` and ``.md`` (``--name``, default ``step_host_overhead``; and
``<name>_profile.txt``); the Markdown (or the JSON with ``--json``) is
printed.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from common import (
    LOG,
    add_output_args,
    configure_logging,
    environment,
    publish,
    require_positive,
    summary,
    utc_timestamp,
    verdict,
)
from torch.utils._pytree import tree_leaves

from slotwise.attention import StaticAttentionMetadata
from slotwise.compilation import CompilationConfig, GraphMode
from slotwise.compilation.compiled_forward import CompiledForward
from slotwise.compilation.direct_entry import DirectEntry
from slotwise.compilation.splitting.piecewise_backend import StaticGraphPiecewiseBackend
from slotwise.compilation.static_graphs.contract import reset_capture_window
from slotwise.compilation.static_graphs.recorded_step import RecordedStep
from slotwise.compilation.static_graphs.wrapper import StaticGraphWrapper
from slotwise.forward_context import set_forward_context
from slotwise.layers.logits import LogitsHead
from slotwise.platforms import Platform, get_current_platform, use_platform
from slotwise_engine.models.llama import PRESETS, build_llama
from slotwise_engine.runner.model_runner import ModelRunner, Request
from slotwise_engine.runner.sampling import Sampler, SamplingParams
from slotwise_engine.runner.step_inputs import StepBuffers, StepInputs

GRAPH_MODES = ("PIECEWISE", "FULL_AND_PIECEWISE")
#: The most a step may take, as a multiple of the reference, per graph mode.
TARGET_RATIOS = {"PIECEWISE": 1.3, "FULL_AND_PIECEWISE": 1.1}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CAPTURE_SIZES = [1, 2, 4, 8]
PROMPT_LEN = 8
WARMUP_STEPS = 20
PROFILE_STEPS = 200
PROFILE_TOP = 25
PROFILER_STEPS = 10

# -- the null device -------------------------------------------------------------------


class NullGraph:
    """A graph whose capture runs the piece; the first replay (the one slotwise checks
    for written outputs) runs it again into the captured outputs, later ones launch
    nothing and leave them as they are."""

    def __init__(self) -> None:
        self.fn: Callable[[], Any] | None = None
        self.outputs: Any = None

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        self.fn = fn
        self.outputs = fn()
        return self.outputs

    def replay(self) -> None:
        if self.fn is None:
            return
        fn, self.fn = self.fn, None
        for captured, value in zip(tree_leaves(self.outputs), tree_leaves(fn()), strict=True):
            if isinstance(captured, torch.Tensor):
                captured.copy_(value)


class RecordingGraph:
    """A graph of ``inner`` that adds its replays to the API's trace while one is taken."""

    def __init__(self, inner: Any, api: RecordingGraphAPI) -> None:
        self.inner = inner
        self.api = api

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        return self.inner.capture(fn, pool, quiet=quiet)

    def replay(self) -> None:
        if self.api.trace is not None:
            self.api.trace.append(("replay", self.inner.replay))
        self.inner.replay()


class RecordingGraphAPI:
    """The GraphAPI the step runs on: ``inner``'s graphs (None: null graphs); while
    ``trace`` is a list, replays and kernel launches are appended to it."""

    def __init__(self, inner: Any | None) -> None:
        self.inner = inner
        self.trace: list[tuple[str, Callable[[], Any]]] | None = None

    def new_graph(self) -> RecordingGraph:
        return RecordingGraph(NullGraph() if self.inner is None else self.inner.new_graph(), self)

    def pool(self) -> Any:
        return None if self.inner is None else self.inner.pool()

    def weak_ref(self, outputs: Any) -> Any:
        return outputs if self.inner is None else self.inner.weak_ref(outputs)


class RecordingLauncher:
    """Stands in for the attention kernel's launcher: its plans launch through ``inner``'s
    (None: nothing; on CUDA the bound compiled kernel) and add each launch to the API's
    trace while one is taken."""

    def __init__(self, inner: Any | None, api: RecordingGraphAPI) -> None:
        self.inner = inner
        self.api = api

    def plan(self, *args: Any) -> RecordingPlan:
        return RecordingPlan(None if self.inner is None else self.inner.plan(*args), self.api)


class RecordingPlan:
    """A ``LaunchPlan`` of the ``RecordingLauncher``: ``inner``'s launches (None:
    nothing), added to the API's trace while one is taken."""

    def __init__(self, inner: Any | None, api: RecordingGraphAPI) -> None:
        self.inner = inner
        self.api = api

    def __call__(self, *args: Any) -> None:
        self.launch(self.inner if self.inner is not None else _no_launch, args)

    def bind(self, *args: Any) -> Callable[[], None]:
        """As ``LaunchPlan.bind``: the inner plan's bound call of ``args`` (``launch``
        looked up at each call, so that the phase hooks see it)."""
        run = _no_launch if self.inner is None else self.inner.bind(*args)

        def launch() -> None:
            self.launch(run, ())

        return launch

    def launch(self, run: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.api.trace is not None:
            self.api.trace.append(("launch", functools.partial(run, *args)))
        run(*args)


def _no_launch(*args: Any) -> None:
    """The null device's kernel launch."""


class NullLogits:
    """The LM head's product replaced by rows of a fixed buffer (host work: a slice)."""

    def __init__(self, rows: int, vocab_size: int) -> None:
        self.logits = torch.randn(rows, vocab_size)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits[: hidden.shape[0]]


class NullDevicePlatform(Platform):
    """The CPU with null graphs and the TRITON_PAGED backend (its kernel nulled)."""

    name = "null_graphs"
    device_type = "cpu"
    default_compile_backend = "eager"

    def __init__(self, api: RecordingGraphAPI) -> None:
        super().__init__()
        self.api = api

    def get_graph_api(self, **kwargs: Any) -> RecordingGraphAPI:
        return self.api

    def synchronize(self, **kwargs: Any) -> None:
        return None

    def get_attention_backend_cls(self, selected: str | None = None, **requirements: Any) -> type:
        from slotwise_cuda.attention import TritonPagedBackend

        return TritonPagedBackend


# -- the step and the reference --------------------------------------------------------


@dataclass
class Setup:
    runner: ModelRunner
    api: RecordingGraphAPI
    platform: Platform
    batch: int
    logits: Callable[[torch.Tensor], torch.Tensor]
    num_layers: int
    #: The decode steps replay one FULL graph (FULL_AND_PIECEWISE): attention is inside.
    full_graph: bool
    reference: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return self.runner.device


def decode_step(setup: Setup, requests: list[Request], sampler: Sampler) -> None:
    """One decode step as ``generate`` makes it: the runner's step, sampling, append."""
    tokens = sampler(setup.runner.step(requests)).tolist()
    for request, token in zip(requests, tokens, strict=True):
        request.tokens.append(token)


def reference_step(calls: list[Callable[[], Any]]) -> None:
    """The reference loop: the calls, one after the other, nothing in between."""
    for call in calls:
        call()


def build_setup(args: argparse.Namespace, stack: contextlib.ExitStack) -> Setup:
    """The runner on ``--device``, its graphs captured, and the reference's calls."""
    import slotwise_cuda.kernels.attention as kernels

    cuda = args.device == "cuda"
    if cuda:
        platform = get_current_platform()
        if platform.device_type != "cuda" or platform.get_graph_api() is None:
            raise SystemExit(
                f"--device cuda needs the cuda platform with CUDA graphs, not {platform.name}"
            )
        api = RecordingGraphAPI(platform.get_graph_api())
        platform.get_graph_api = lambda **kwargs: api  # type: ignore[method-assign]
        stack.callback(delattr, platform, "get_graph_api")
    else:
        api = RecordingGraphAPI(None)
        platform = NullDevicePlatform(api)
        stack.enter_context(use_platform(platform))
    real_launcher = kernels._paged_attention_launcher
    kernels._paged_attention_launcher = RecordingLauncher(real_launcher if cuda else None, api)
    stack.callback(setattr, kernels, "_paged_attention_launcher", real_launcher)
    stack.callback(reset_capture_window)

    preset = PRESETS[args.preset]
    config = CompilationConfig(
        level=3,
        backend=args.backend,
        graph_mode=args.graph_mode,
        capture_sizes=CAPTURE_SIZES,
        disable_cache=True,
    )
    model = build_llama(
        args.preset, seed=0, compilation_config=config, dtype=args.dtype, device=args.device
    )
    if args.lm_head == "real":
        logits = lm_head_logits(model)
    else:
        # Set before the first call: Dynamo's guards on the model then see it already.
        logits = NullLogits(max(CAPTURE_SIZES), preset.vocab_size)
        model.compute_logits = logits  # type: ignore[method-assign]
    # The longest run: profiling, or the device metrics' two runs and the profiler's.
    tokens = PROMPT_LEN + max(PROFILE_STEPS, WARMUP_STEPS, 2 * args.steps + PROFILER_STEPS) + 4
    runner = ModelRunner(model, num_blocks=args.batch * -(-tokens // preset.block_size) + 2)
    LOG.info("capturing %s graphs for sizes %s", "CUDA" if cuda else "null", CAPTURE_SIZES)
    runner.capture(progress=False)
    full_graph = runner.dispatcher.dispatch(args.batch, uniform_decode=True).mode == GraphMode.FULL
    setup = Setup(runner, api, platform, args.batch, logits, preset.num_layers, full_graph)
    setup.reference = trace_reference(setup)
    return setup


def lm_head_logits(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The reference's logits: the LM head's product alone, in float32 as the step's."""
    weight = model.lm_head.weight

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden, weight).float()

    return logits


def reference_hidden(setup: Setup) -> torch.Tensor:
    """The hidden states the reference's logits read: the model's dtype, as the step's."""
    model = setup.runner.model
    dtype = next(model.parameters()).dtype
    return torch.zeros(setup.batch, model.config.hidden_size, dtype=dtype, device=setup.device)


def trace_reference(setup: Setup) -> list[Callable[[], Any]]:
    """The reference loop's calls: the input copies, every replay and launch of one real
    decode step in its order, each launch preceded by its layer's KV write (under
    FULL_AND_PIECEWISE: the metadata copies and the one replay), then the logits and
    the argmax."""
    runner = setup.runner
    requests = runner.add_requests([[1] * PROMPT_LEN] * setup.batch, 4)
    sampler = Sampler([SamplingParams()] * setup.batch, setup.device)
    decode_step(setup, requests, sampler)  # the prefill
    setup.api.trace = trace = []
    try:
        decode_step(setup, requests, sampler)
    finally:
        setup.api.trace = None
    runner.free(requests)
    buffers = runner.step_inputs.graph
    assert buffers is not None
    ids = torch.ones(setup.batch, dtype=torch.long, device=setup.device)
    calls: list[Callable[[], Any]] = [
        lambda: buffers.input_ids[: setup.batch].copy_(ids),
        lambda: buffers.positions[: setup.batch].copy_(ids),
    ]
    caches = [m.kv_cache for m in runner.model.modules() if hasattr(m, "attn_backend")]
    if setup.full_graph:
        assert runner.static_metadata is not None
        calls += metadata_copies(runner.static_metadata, setup.batch)
    writes = iter([kv_write(cache, setup.batch) for cache in caches])
    for kind, call in trace:
        if kind == "launch":
            calls.append(next(writes))
        calls.append(call)
    launches = sum(kind == "launch" for kind, _ in trace)
    replays = sum(kind == "replay" for kind, _ in trace)
    expected = (0, 1) if setup.full_graph else (len(caches), len(caches) + 1)
    if (launches, replays) != expected:
        raise RuntimeError(
            f"traced {launches} attention launches and {replays} replays for "
            f"{len(caches)} layers, not {expected[0]} and {expected[1]}"
        )
    hidden = reference_hidden(setup)
    calls.append(lambda: setup.logits(hidden).argmax(-1).tolist())
    return calls


def metadata_copies(static: StaticAttentionMetadata, batch: int) -> list[Callable[[], Any]]:
    """What a decode step changes in the static metadata a FULL graph reads, copied in
    (the values the traced step left there): each request's sequence length and slot."""
    seq_lens = static.seq_lens[:batch].clone()
    slots = static.slot_mapping[:batch].clone()
    return [
        lambda: static.seq_lens[:batch].copy_(seq_lens),
        lambda: static.slot_mapping[:batch].copy_(slots),
    ]


def kv_write(kv_cache: torch.Tensor, batch: int) -> Callable[[], Any]:
    """The KV write's launches, as the backend makes them: ``batch`` new keys into the
    key half of ``kv_cache``, then as many values into its value half."""
    two, num_blocks, block_size, heads, head_size = kv_cache.shape
    keys, values = kv_cache.view(two, num_blocks * block_size, heads, head_size)
    new = torch.zeros(batch, heads, head_size, dtype=kv_cache.dtype, device=kv_cache.device)
    slot_mapping = torch.arange(batch, dtype=torch.long, device=kv_cache.device)

    def write() -> None:
        keys.index_copy_(0, slot_mapping, new)
        values.index_copy_(0, slot_mapping, new)

    return write


# -- timing ----------------------------------------------------------------------------


@contextlib.contextmanager
def decoding(setup: Setup, steps: int) -> Iterator[tuple[list[Request], Sampler]]:
    """Requests with room for ``steps`` decode steps, prefilled; freed afterwards."""
    runner = setup.runner
    requests = runner.add_requests([[1] * PROMPT_LEN] * setup.batch, steps + 2)
    sampler = Sampler([SamplingParams()] * setup.batch, setup.device)
    decode_step(setup, requests, sampler)
    try:
        yield requests, sampler
    finally:
        runner.free(requests)


def time_steps(setup: Setup, calls: int) -> tuple[list[float], list[float]]:
    """Host µs of each of ``calls`` decode steps and of as many reference steps, taken
    in turns; the device is synchronised between steps, outside the timed calls."""
    sync = setup.platform.synchronize
    step_us, reference_us = [], []
    with decoding(setup, calls) as (requests, sampler):
        for _ in range(calls):
            sync()
            start = time.perf_counter()
            decode_step(setup, requests, sampler)
            step_us.append((time.perf_counter() - start) * 1e6)
            sync()
            start = time.perf_counter()
            reference_step(setup.reference)
            reference_us.append((time.perf_counter() - start) * 1e6)
    return step_us, reference_us


def measure(setup: Setup, rounds: int, calls: int) -> dict[str, list[float]]:
    """Per round, the median µs of ``calls`` steps and of ``calls`` reference steps;
    µs per layer in the report are a phase's µs per step divided by the layers."""
    time_steps(setup, WARMUP_STEPS)
    samples: dict[str, list[float]] = {"step": [], "reference": []}
    for i in range(rounds):
        if i == 0 or (i + 1) % 10 == 0:
            LOG.info("round %d/%d", i + 1, rounds)
        step_us, reference_us = time_steps(setup, calls)
        samples["step"].append(statistics.median(step_us))
        samples["reference"].append(statistics.median(reference_us))
    return samples


# -- phases ----------------------------------------------------------------------------


class PhaseClock:
    """Exclusive time per phase: entering a phase charges the time since the last event
    to the phase it interrupts."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.stack: list[str] = []
        self.last = 0

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = self

        def run(*args: Any, **kwargs: Any) -> Any:
            now = time.perf_counter_ns()
            if clock.stack:
                clock.ns[clock.stack[-1]] += now - clock.last
            clock.stack.append(phase)
            clock.last = now
            try:
                return fn(*args, **kwargs)
            finally:
                now = time.perf_counter_ns()
                clock.ns[clock.stack.pop()] += now - clock.last
                clock.last = now

        return run


def phase_hooks(setup: Setup) -> list[tuple[str, Any, str]]:
    """The phases timed by wrapping a function: (phase, owner, attribute).  The attention
    op's dispatch and body are timed apart (``time_attention_op``) and taken out of the
    model entry, which they run inside.  No hook touches the model's own attributes:
    Dynamo's guards would then take their slow path."""
    import slotwise_cuda.attention as backend
    import slotwise_cuda.kernels.attention as kernels

    runner = setup.runner
    hooks = [
        ("runner: step inputs", ModelRunner, "step"),
        ("runner: input write", StepInputs, "write"),
        ("runner: input upload", StepBuffers, "upload"),
        ("runner: metadata build", ModelRunner, "_step_metadata"),
        ("runner: metadata build", ModelRunner, "_static_step_metadata"),
        ("runner: model call", ModelRunner, "_run"),
        ("model entry", CompiledForward, "__call__"),
        ("model entry", DirectEntry, "__call__"),
        ("recorded step", RecordedStep, "run"),
        ("graph wrapper", StaticGraphPiecewiseBackend, "__call__"),
        ("graph wrapper", StaticGraphWrapper, "__call__"),
        ("graph replay", RecordingGraph, "replay"),
        ("attention: kv write", backend._LayerCalls, "run"),
        ("attention: launch binding and checks", kernels, "PagedAttentionLaunch"),
        ("attention: launch", RecordingPlan, "launch"),
        ("sampling", Sampler, "__call__"),
        (
            "sampling",
            NullLogits if isinstance(setup.logits, NullLogits) else LogitsHead,
            "__call__",
        ),
    ]
    if not setup.full_graph:
        hooks += [
            ("attention: bound-call lookup", layer.impl, "forward")
            for layer in attention_layers(runner)
        ]
    return hooks


def attention_layers(runner: ModelRunner) -> list[Any]:
    return [module for module in runner.model.modules() if hasattr(module, "attn_backend")]


@contextlib.contextmanager
def instrumented(setup: Setup, clock: PhaseClock) -> Iterator[None]:
    """Every hook wrapped by ``clock`` inside the block, restored after it."""
    missing = object()
    undo = []
    try:
        for phase, owner, name in phase_hooks(setup):
            undo.append((owner, name, vars(owner).get(name, missing)))
            setattr(owner, name, clock.timed(phase, getattr(owner, name)))
        yield
    finally:
        for owner, name, original in reversed(undo):
            if original is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def measure_phases(setup: Setup, rounds: int, steps: int) -> dict[str, float]:
    """Exclusive µs per step of each phase: the median over ``rounds`` rounds of
    ``steps`` instrumented decode steps."""
    clock = PhaseClock()
    root = clock.timed("runner: step inputs", decode_step)
    per_round: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        with decoding(setup, steps) as (requests, sampler), instrumented(setup, clock):
            # Recorded steps hold bound calls: recorded again below, they bind the hooks.
            if setup.runner.recorded_steps:
                setup.runner.recorded_steps.clear()
            # The wrappers' first calls and the recording, then its first run, which binds
            # each layer's attention calls to the step's metadata.
            root(setup, requests, sampler)
            root(setup, requests, sampler)
            clock.ns.clear()
            for _ in range(steps):
                setup.platform.synchronize()
                root(setup, requests, sampler)
        for phase, ns in clock.ns.items():
            per_round[phase].append(ns / steps / 1e3)
    if setup.runner.recorded_steps:  # recorded again, without the hooks
        setup.runner.recorded_steps.clear()
    return {phase: statistics.median(values) for phase, values in per_round.items()}


def time_attention_op(setup: Setup, calls: int) -> dict[str, float]:
    """µs per call of the attention op's dispatch (the split graph's direct call into the
    layer's ``LayerAttention``, which takes the place of torch's dispatcher) and of its
    body (what it does before the backend), with the backend's ``forward`` replaced by
    nothing: the call as the split graph makes it, then its ``run``."""
    from slotwise.attention import ops

    runner = setup.runner
    layer = attention_layers(runner)[0]
    batch = setup.batch
    dtype = layer.kv_cache.dtype
    q = torch.zeros(batch, layer.num_heads, layer.head_size, dtype=dtype, device=setup.device)
    k = torch.zeros(batch, layer.num_kv_heads, layer.head_size, dtype=dtype, device=setup.device)
    out = torch.empty_like(q)
    metadata = runner.metadata_builder.build([1] * batch, [PROMPT_LEN] * batch, [[0]] * batch)
    call = ops.layer_attention(layer.layer_name)
    layer.impl.forward = lambda *args: None
    try:
        with torch.inference_mode(), set_forward_context(metadata):
            through_op = _us_per_call(lambda: call(q, k, k, out), calls)
            body = _us_per_call(lambda: call.run(q, k, k, out), calls)
    finally:
        del layer.impl.forward
    return {"attention: op dispatch": through_op - body, "attention: op body": body}


def _us_per_call(call: Callable[[], Any], calls: int) -> float:
    """The median over 5 runs of ``calls`` calls, in µs per call."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def device_metrics(setup: Setup, steps: int) -> dict[str, float]:
    """On CUDA: device µs per step (CUDA events around each step) and kernel launches
    per step (torch.profiler's CUDA runtime launch calls) for the step and the reference."""
    from torch.profiler import ProfilerActivity, profile

    results: dict[str, float] = {}
    with decoding(setup, 2 * steps + PROFILER_STEPS) as (requests, sampler):
        runs = {
            "step": lambda: decode_step(setup, requests, sampler),
            "reference": lambda: reference_step(setup.reference),
        }
        for name, run in runs.items():
            elapsed = []
            for _ in range(steps):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                run()
                end.record()
                end.synchronize()
                elapsed.append(start.elapsed_time(end) * 1e3)
            results[f"{name}_device_us"] = round(statistics.median(elapsed), 1)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(PROFILER_STEPS):
                    run()
                torch.cuda.synchronize()
            launches = sum(
                event.count
                for event in prof.key_averages()
                if "LaunchKernel" in event.key or "GraphLaunch" in event.key
            )
            results[f"{name}_launches_per_step"] = round(launches / PROFILER_STEPS, 1)
    return results


def attention_launch() -> str:
    """On CUDA: how the attention kernel was launched, bound or through Triton's JIT
    (and why)."""
    import slotwise_cuda.kernels.attention as kernels

    launcher = kernels._paged_attention_launcher.inner  # the RecordingLauncher's
    reason = launcher.fallback_reason
    return "bound compiled kernel" if reason is None else f"Triton's JIT: {reason}"


def profile_steps(setup: Setup, steps: int) -> tuple[str, list[dict[str, Any]]]:
    """cProfile ``steps`` decode steps; the text report and the top functions by own time."""
    profiler = cProfile.Profile()
    with decoding(setup, steps) as (requests, sampler):
        profiler.enable()
        for _ in range(steps):
            decode_step(setup, requests, sampler)
        profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(PROFILE_TOP)
    stats.sort_stats("cumulative").print_stats(PROFILE_TOP)
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    ranked = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:PROFILE_TOP]
    rows = [
        {
            "function": f"{filename}:{line}({function})",
            "calls_per_step": round(ncalls / steps, 2),
            "own_us_per_step": round(tottime / steps * 1e6, 1),
        }
        for (filename, line, function), (_, ncalls, tottime, _, _) in ranked
    ]
    return stream.getvalue(), rows


# -- the report ------------------------------------------------------------------------

#: Phases reported per layer: they run once per attention layer.
PER_LAYER = ("attention: ",)


def build_report(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """Run the measurement; the report and, with ``--profile``, the profiler's text."""
    torch.set_num_threads(args.threads)
    with contextlib.ExitStack() as stack:
        setup = build_setup(args, stack)
        samples = measure(setup, args.rounds, args.steps)
        phases = measure_phases(setup, args.rounds, args.steps)
        layers = setup.num_layers
        # Inside a FULL graph the op is not called; a recorded step calls what each
        # layer's backend bound, past the op.
        if not setup.full_graph and "recorded step" not in phases:
            op = time_attention_op(setup, 200 * args.steps)
            phases["model entry"] -= layers * sum(op.values())
            phases.update({name: value * layers for name, value in op.items()})
        step = statistics.median(samples["step"])
        reference = statistics.median(samples["reference"])
        ratio = step / reference
        target = TARGET_RATIOS[args.graph_mode]
        instrumented_total = sum(phases.values())
        report: dict[str, Any] = {
            **environment(),
            "device": args.device,
            "dtype": str(args.dtype).removeprefix("torch."),
            "lm_head": args.lm_head,
            "torch_threads": torch.get_num_threads(),
            "preset": args.preset,
            "num_layers": layers,
            "batch": args.batch,
            "compile_backend": args.backend,
            "graph_mode": args.graph_mode,
            "full_graph_step": setup.full_graph,
            "capture_sizes": CAPTURE_SIZES,
            "attention_backend": "TRITON_PAGED",
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "step_us": summary(samples["step"], 1),
            "reference_us": summary(samples["reference"], 1),
            "paired_ratio": round(
                statistics.median(
                    s / r for s, r in zip(samples["step"], samples["reference"], strict=True)
                ),
                3,
            ),
            "ratio": round(ratio, 3),
            "target_ratio": target,
            "meets_target": ratio <= target,
            "phases_us_per_step": {name: round(value, 2) for name, value in sorted(phases.items())},
            "phases_us_per_layer": {
                name: round(value / layers, 2)
                for name, value in sorted(phases.items())
                if name.startswith(PER_LAYER)
            },
            "probe_us_per_step": round(instrumented_total - step, 1),
            "reference_calls_per_step": len(setup.reference),
            "timestamp": utc_timestamp(),
        }
        if args.device == "cuda":
            report["device_metrics"] = device_metrics(setup, args.steps)
            report["attention_launch"] = attention_launch()
        profile_text = None
        if args.profile:
            LOG.info("profiling %d decode steps", PROFILE_STEPS)
            profile_text, rows = profile_steps(setup, PROFILE_STEPS)
            report["profile_top_by_own_time"] = rows
    return report, profile_text


def render_markdown(report: dict[str, Any]) -> str:
    """The step against the reference, then the phases per step and per layer."""
    step, reference = report["step_us"], report["reference_us"]
    lines = [
        f"Host time of a decode step under {report['graph_mode']}: preset `{report['preset']}` "
        f"({report['num_layers']} layers), batch {report['batch']}, device {report['device']} "
        f"({report['dtype']}), {report['rounds']} rounds x {report['steps_per_round']} steps",
        "",
        "| loop | median (µs/step) | min | p90 |",
        "|---|---:|---:|---:|",
        f"| slotwise step | {step['median']:.1f} | {step['min']:.1f} | {step['p90']:.1f} |",
        f"| reference | {reference['median']:.1f} | {reference['min']:.1f} "
        f"| {reference['p90']:.1f} |",
        "",
        f"step / reference: {report['ratio']:.3f}x (paired {report['paired_ratio']:.3f}x; "
        f"target <= {report['target_ratio']:.1f}x): **{verdict(report['meets_target'])}**",
        "",
        "| phase | µs/step | µs/layer |",
        "|---|---:|---:|",
    ]
    per_layer = report["phases_us_per_layer"]
    for name, value in report["phases_us_per_step"].items():
        layer = f"{per_layer[name]:.2f}" if name in per_layer else ""
        lines.append(f"| {name} | {value:.2f} | {layer} |")
    lines += [
        "",
        f"phases from an instrumented run (its probes add {report['probe_us_per_step']:.1f} "
        "µs/step)"
        + (
            ""
            if report["full_graph_step"] or "recorded step" in report["phases_us_per_step"]
            else "; the op's dispatch and body are timed apart and taken out of the model entry"
        ),
    ]
    metrics = report.get("device_metrics")
    if metrics:
        lines += [
            "",
            "| loop | device µs/step | launches/step |",
            "|---|---:|---:|",
            f"| slotwise step | {metrics['step_device_us']:.1f} "
            f"| {metrics['step_launches_per_step']:.1f} |",
            f"| reference | {metrics['reference_device_us']:.1f} "
            f"| {metrics['reference_launches_per_step']:.1f} |",
            "",
            f"attention kernel launched through: {report['attention_launch']}",
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=1, help="requests per decode step")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--graph-mode",
        default="PIECEWISE",
        choices=GRAPH_MODES,
        help="PIECEWISE: pieces' graphs with attention between them; FULL_AND_PIECEWISE: "
        "decode steps replay one graph of the whole model",
    )
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        help="model dtype (default: bfloat16 on cuda, else float32)",
    )
    parser.add_argument(
        "--lm-head",
        choices=("null", "real"),
        help="the LM head's product: a fixed logits buffer (null) or the real one "
        "(default: real on cuda, else null)",
    )
    parser.add_argument("--backend", default="eager", help="compiler of the level-3 pieces")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds")
    parser.add_argument("--steps", type=int, default=20, help="decode steps per round")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--profile", action="store_true", help="also cProfile the step")
    parser.add_argument(
        "--name", default="step_host_overhead", help="results go to NAME.json and NAME.md"
    )
    add_output_args(parser)
    args = parser.parse_args(argv)
    require_positive(parser, args, "batch", "rounds", "steps", "threads")
    if args.batch > max(CAPTURE_SIZES):
        parser.error(f"--batch must be at most {max(CAPTURE_SIZES)}, the largest capture size")
    cuda = args.device == "cuda"
    args.dtype = DTYPES[args.dtype or ("bfloat16" if cuda else "float32")]
    args.lm_head = args.lm_head or ("real" if cuda else "null")
    return args


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    args = parse_args(argv)
    report, profile_text = build_report(args)
    publish(args.name, report, render_markdown(report), args, profile_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
