"""The attention kernel's bound launch: Triton's compiled kernel, bound once per key.

On the CPU the kernel runs in Triton's interpreter, which has no compiled kernels, so
the launcher is given a compile step that stands in for ``JITFunction.warmup``: it
records Triton's own specialisation of the arguments it binds (``native_specialize_impl``
with the kernel's ``do_not_specialize`` lists, what the JIT computes on a GPU) and
returns a "compiled kernel" that checks every later launch specialises the same way
before it runs the interpreted kernel on the arguments as a ``CompiledKernel`` gets them.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch
import triton
from triton.backends.compiler import BaseBackend
from triton.runtime.jit import JITFunction

from slotwise_cuda.kernels import attention
from slotwise_cuda.kernels.bound_launch import KernelLauncher

NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE, NUM_BLOCKS = 2, 32, 8, 12


@functools.cache
def kernel_params(kernel):
    """The kernel's parameters as Triton's JIT sees them (the interpreter keeps none)."""
    return (
        kernel.params
        if isinstance(kernel, JITFunction)
        else JITFunction(kernel.fn, **kernel.kwargs).params
    )


def triton_specialisation(kernel, args, constants):
    """What Triton's JIT specialises the kernel on for these arguments."""
    from triton._C.libtriton import native_specialize_impl

    params = kernel_params(kernel)
    values = [*args, *(constants[p.name] for p in params[len(args) :])]
    spec = []
    for param, value in zip(params, values, strict=True):
        if param.is_constexpr:
            spec.append(("constexpr", value))
        else:
            spec.append(
                native_specialize_impl(
                    BaseBackend,
                    value,
                    False,
                    not param.do_not_specialize,
                    not param.do_not_specialize_on_alignment,
                )
            )
    return tuple(spec)


class CheckingCompile:
    """Stands in for ``JITFunction.warmup``: one "compiled kernel" per call, which runs
    ``kernel`` (interpreted) as a CompiledKernel would and checks each launch's
    arguments specialise as the bound ones did."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled = []

    def __call__(self, kernel, grid, args, constants):
        specialisation = triton_specialisation(kernel, args, constants)
        compiled = CheckedKernel(self.kernel, specialisation, len(constants))
        self.compiled.append(compiled)
        return compiled


class CheckedKernel:
    def __init__(self, kernel, specialisation, num_constants):
        self.kernel = kernel
        self.specialisation = specialisation
        self.num_constants = num_constants
        self.launches = 0

    def __getitem__(self, grid):
        split = len(self.kernel.arg_names) - self.num_constants
        names = self.kernel.arg_names[split:]

        def run(*values):  # every argument in the kernel's order, constexprs included
            args, constants = values[:split], dict(zip(names, values[split:], strict=True))
            assert triton_specialisation(self.kernel, args, constants) == self.specialisation
            self.launches += 1
            self.kernel[grid](*args, **constants)

        return run


@pytest.fixture
def bound(monkeypatch):
    """The attention module's launches through a bound launcher with a checking compile."""
    kernel = attention._paged_attention_kernel
    compile = CheckingCompile(kernel)
    launcher = KernelLauncher(kernel, compile=compile, unbound=lambda kernel: None)
    monkeypatch.setattr(attention, "_paged_attention_launcher", launcher)
    return compile


def step(device, query_lens, context_lens, width, dtype=torch.float32, seed=0):
    """One step's tensors: a batch ``[decodes..., prefills...]`` over a shared cache,
    its block table ``width`` columns wide (unused columns point past the cache)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    table = torch.full((len(seq_lens), width), 10 * NUM_BLOCKS, dtype=torch.int32)
    ids = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    for s, n in enumerate(seq_lens):
        blocks = triton.cdiv(n, BLOCK_SIZE)
        table[s, :blocks] = torch.tensor(ids[s : s + blocks], dtype=torch.int32)
    cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, generator=gen)
    q = torch.randn(sum(query_lens), 2 * NUM_KV_HEADS, HEAD_SIZE, generator=gen)
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    on = {"device": device}
    return {
        "q": q.to(dtype).to(**on),
        "k_cache": cache.to(dtype).to(**on),
        "v_cache": cache.flip(0).to(dtype).to(**on),
        "block_table": table.to(**on),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=device),
        "query_start_loc": starts.to(**on),
    }


def leading_decodes(query_lens):
    """The batch's decodes: the requests of one query token before the first prefill."""
    return next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))


def attend(tensors, decodes):
    """The backend's launches for one step: the decodes' rows, then the prefills' on
    views of the same tensors starting where the decodes end."""
    t = tensors
    out = torch.zeros_like(t["q"])
    scale = HEAD_SIZE**-0.5
    if decodes:
        attention.paged_decode_attention(
            t["q"][:decodes], t["k_cache"], t["v_cache"], t["block_table"][:decodes],
            t["seq_lens"][:decodes], scale, out[:decodes],
        )  # fmt: skip
    if t["seq_lens"].shape[0] > decodes:
        starts = t["query_start_loc"][decodes:] - t["query_start_loc"][decodes]
        attention.paged_prefill_attention(
            t["q"][decodes:], t["k_cache"], t["v_cache"], t["block_table"][decodes:],
            starts, t["seq_lens"][decodes:], scale, out[decodes:],
        )  # fmt: skip
    return out


#: Steps of a run: (query lengths, context lengths, block table width).  The decodes'
#: count moves the prefills' int32 views to unaligned addresses; the table widens.
STEPS = [
    ([1, 1], [5, 9], 2),
    ([1, 1], [6, 10], 3),
    ([1, 1, 1], [7, 11, 2], 16),
    ([1, 4], [8, 0], 17),
    ([3, 5], [0, 2], 17),
    ([1, 1, 1, 2], [9, 13, 4, 6], 24),
]


def test_bound_launches_match_the_jit_and_bind_once_per_layout(bound, device):
    for number, (query_lens, context_lens, width) in enumerate(STEPS):
        tensors = step(device, query_lens, context_lens, width, seed=number)
        decodes = leading_decodes(query_lens)
        with_bound = attend(tensors, decodes)
        jit = KernelLauncher(
            attention._paged_attention_kernel, unbound=lambda kernel: (logging.DEBUG, "test")
        )
        bound_launcher = attention._paged_attention_launcher
        attention._paged_attention_launcher = jit
        try:
            through_jit = attend(tensors, decodes)
        finally:
            attention._paged_attention_launcher = bound_launcher
        assert torch.equal(with_bound, through_jit)
    # One decode and one prefill binding for the whole run, however many sequences a
    # step has, wherever its views start and however wide its block table is; each
    # launch checked to specialise as its binding did.
    assert len(bound.compiled) == 2
    launches = sum(kernel.launches for kernel in bound.compiled)
    assert launches == sum((lens[0] == 1) + (max(lens) > 1) for lens, _, _ in STEPS)


def test_another_alignment_or_dtype_binds_again(bound, device):
    tensors = step(device, [1, 1], [5, 9], 3)
    attend(tensors, 2)
    attend(step(device, [1, 1], [3, 4], 5, seed=1), 2)
    assert len(bound.compiled) == 1
    # q starting 4 bytes into its storage: Triton specialises on a 16-byte alignment.
    storage = torch.zeros(tensors["q"].numel() + 1, device=device)
    shifted = storage[1:].view(tensors["q"].shape)
    shifted.copy_(tensors["q"])
    out = torch.zeros_like(tensors["q"])
    attention.paged_decode_attention(
        shifted, tensors["k_cache"], tensors["v_cache"], tensors["block_table"],
        tensors["seq_lens"], HEAD_SIZE**-0.5, out,
    )  # fmt: skip
    assert len(bound.compiled) == 2
    attend(step(device, [1, 1], [5, 9], 3, dtype=torch.float16), 2)
    assert len(bound.compiled) == 3


class FakeKernel:
    """A kernel of two arguments and one constexpr, recording its JIT launches."""

    arg_names = ["x", "n", "BLOCK"]
    __name__ = "fake_kernel"

    def __init__(self):
        self.jit_launches = []

    def __getitem__(self, grid):
        return lambda *args, **constants: self.jit_launches.append((grid, args, constants))


def test_a_binding_that_fails_falls_back_to_the_jit_with_one_log_record(caplog):
    kernel = FakeKernel()
    attempts = []

    def failing(kernel, grid, args, constants):
        attempts.append(grid)
        raise RuntimeError("no CUDA driver")

    launcher = KernelLauncher(kernel, compile=failing, unbound=lambda kernel: None)
    x = torch.zeros(4)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        launcher.plan((1,), {"BLOCK": 16}, "key", [0])(x, 3)
        launcher.plan((2,), {"BLOCK": 16}, "key", [0])(x, 5)
    assert [r.getMessage() for r in caplog.records] == [
        "Triton kernel fake_kernel launches through the JIT on every call: binding or "
        "launching its compiled kernel failed: RuntimeError('no CUDA driver')"
    ]
    assert caplog.records[0].levelno == logging.WARNING
    assert attempts == [(1,)]  # not tried again
    assert kernel.jit_launches == [((1,), (x, 3), {"BLOCK": 16}), ((2,), (x, 5), {"BLOCK": 16})]


def test_a_bound_launch_that_fails_is_launched_again_through_the_jit(caplog):
    # E.g. a Triton whose compiled kernels take their arguments another way.
    class Refusing:
        def __getitem__(self, grid):
            def run(*values):
                raise TypeError(f"expected 2 arguments, got {len(values)}")

            return run

    kernel = FakeKernel()
    launcher = KernelLauncher(kernel, compile=lambda *a: Refusing(), unbound=lambda k: None)
    x = torch.zeros(4)
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        plan = launcher.plan((1,), {"BLOCK": 16}, "key", [0])
        plan(x, 3)
        plan(x, 4)
    assert len(caplog.records) == 1
    assert "TypeError('expected 2 arguments, got 3')" in caplog.records[0].getMessage()
    assert kernel.jit_launches == [((1,), (x, 3), {"BLOCK": 16}), ((1,), (x, 4), {"BLOCK": 16})]


def test_a_plan_relaunches_its_binding_with_each_calls_arguments():
    kernel = FakeKernel()
    launched = []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *values: launched.append((grid, values))

    compiled = []
    launcher = KernelLauncher(
        kernel,
        compile=lambda *args: compiled.append(args) or Compiled(),
        unbound=lambda kernel: None,
    )
    x, y = torch.zeros(4), torch.ones(8)
    plan = launcher.plan((3,), {"BLOCK": 32}, "key", [0])
    plan(x, 1)
    plan(y, 2)
    launcher.plan((5,), {"BLOCK": 32}, "key", [0])(y, 7)  # the next step's plan
    assert len(compiled) == 1
    # The constexprs go last, in the kernel's order, as CompiledKernel's launcher takes them.
    assert launched == [((3,), (x, 1, 32)), ((3,), (y, 2, 32)), ((5,), (y, 7, 32))]
    assert kernel.jit_launches == []
    assert launcher.fallback_reason is None


def test_the_interpreter_runs_the_jit_path_and_says_so(caplog, device, monkeypatch):
    if device == "cuda":
        pytest.skip("on a GPU the kernel is compiled, not interpreted")
    launcher = KernelLauncher(attention._paged_attention_kernel)
    monkeypatch.setattr(attention, "_paged_attention_launcher", launcher)
    tensors = step(device, [1, 1], [5, 9], 3)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        out = attend(tensors, 2)
        attend(tensors, 2)
    assert [r.getMessage() for r in caplog.records] == [
        "Triton kernel _paged_attention_kernel launches through the JIT on every call: "
        "Triton's interpreter runs it (TRITON_INTERPRET=1)"
    ]
    assert out.abs().sum() > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_on_the_gpu_the_compiled_kernel_is_bound_and_matches_the_jit(monkeypatch):
    kernel = attention._paged_attention_kernel
    bound = KernelLauncher(kernel)
    jit = KernelLauncher(kernel, unbound=lambda kernel: (logging.INFO, "the JIT path's test"))
    kernel_cache = kernel.device_caches[torch.cuda.current_device()][0]
    compiled_before = len(kernel_cache)
    for number, (query_lens, context_lens, width) in enumerate(STEPS):
        tensors = step("cuda", query_lens, context_lens, width, torch.bfloat16, seed=number)
        decodes = leading_decodes(query_lens)
        monkeypatch.setattr(attention, "_paged_attention_launcher", bound)
        with_bound = attend(tensors, decodes)
        monkeypatch.setattr(attention, "_paged_attention_launcher", jit)
        through_jit = attend(tensors, decodes)
        torch.cuda.synchronize()
        assert torch.equal(with_bound, through_jit)
    assert bound.fallback_reason is None
    assert len(bound._compiled) == 2  # one decode and one prefill kernel for the whole run
    # Neither path compiled again as the block table widened or the batch changed.
    assert len(kernel_cache) - compiled_before <= 2


def test_a_bound_call_launches_on_its_tensors_as_they_are_when_it_is_made(bound, device):
    # What a backend keeps from step to step: the launch bound to the step's tensors,
    # which a runner rewrites in place; made before any launch, it binds on its first.
    tensors = step(device, [1, 1], [5, 9], 3)
    out = torch.zeros_like(tensors["q"])
    launch = attention.PagedAttentionLaunch(
        tensors["q"], tensors["k_cache"], tensors["v_cache"], tensors["block_table"],
        tensors["seq_lens"], out,
    )  # fmt: skip
    arguments = (
        tensors["q"], tensors["k_cache"], tensors["v_cache"], tensors["block_table"],
        tensors["seq_lens"], out, HEAD_SIZE**-0.5,
    )  # fmt: skip
    first = launch.bind(*arguments)
    first()
    call = launch.bind(*arguments)  # now the compiled kernel with its arguments
    for seed, context_lens in enumerate(([6, 10], [7, 3]), start=1):
        later = step(device, [1, 1], context_lens, 3, seed=seed)
        for name in ("q", "k_cache", "v_cache", "block_table", "seq_lens"):
            tensors[name].copy_(later[name])
        call()
        torch.testing.assert_close(out, attend(later, 2), rtol=0, atol=0)
    assert len(bound.compiled) == 1
    assert bound.compiled[0].launches == 3 + 2  # these three, the two references
