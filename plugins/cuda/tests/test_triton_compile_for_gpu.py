"""The kernels compile for real GPUs, checked without one.

The interpreter accepts things the compiler rejects (non-constexpr globals, dot tiles
under 16, host calls inside a kernel) and ignores resources. Triton's wheel ships
ptxas, so each launcher is run with its kernel swapped for a recorder that compiles
exactly the arguments it was given, ahead of time for sm_86 (the smallest shared memory
of the targets we care about) and sm_90. It runs in a fresh interpreter because kernels
in this process are built for the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from slotwise_cuda.kernels import activation, attention, layernorm, rotary
    from slotwise_cuda.kernels.bound_launch import KernelLauncher

    TARGETS = [GPUTarget("cuda", 86, 32), GPUTarget("cuda", 90, 32)]
    SHARED_LIMIT = 99 * 1024  # per block on sm_86 / sm_89
    POINTER = {
        torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
        torch.int32: "*i32", torch.int64: "*i64",
    }

    class Recorder:
        def __init__(self, module, name):
            self.fn = getattr(module, name)
            setattr(module, name, self)

        def __getitem__(self, grid):
            return self.compile

        def compile(self, *args, **kwargs):
            values = dict(zip(self.fn.arg_names, args))
            options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
            values.update(kwargs)
            signature, constexprs = {}, {}
            for param in self.fn.params:
                value = values[param.name]
                # A real launch turns integer arguments equal to 1 into constants too,
                # unless the kernel says not to specialise on them.
                one = type(value) is int and value == 1 and not param.do_not_specialize
                if param.is_constexpr or one:
                    signature[param.name] = "constexpr"
                    constexprs[param.name] = value
                elif isinstance(value, torch.Tensor):
                    signature[param.name] = POINTER[value.dtype]
                else:
                    signature[param.name] = "fp32" if isinstance(value, float) else "i32"
            for target in TARGETS:
                kernel = triton.compile(
                    ASTSource(self.fn, signature, constexprs), target=target, options=options
                )
                shared = kernel.metadata.shared
                assert shared <= SHARED_LIMIT, (self.fn.__name__, constexprs, target, shared)

    for module, name in [
        (attention, "_paged_attention_kernel"),
        (layernorm, "_rms_norm_kernel"),
        (activation, "_silu_and_mul_kernel"),
        (rotary, "_rotary_kernel"),
    ]:
        Recorder(module, name)
    # The attention kernel launches through its launcher, which takes a stand-in that is
    # no JITFunction through the JIT path, i.e. into the recorder.
    attention._paged_attention_launcher = KernelLauncher(attention._paged_attention_kernel)

    # Prefill in fp32 at head size 128 needs the most shared memory. In bf16 at head size
    # 80 with 8 query heads per KV head, the padded and low-precision paths, on a
    # single sequence.
    i32 = torch.int32
    table = torch.zeros(2, 4, dtype=i32)
    seq_lens = torch.tensor([3, 30], dtype=i32)
    qsl = torch.tensor([0, 3, 6], dtype=i32)
    q = torch.empty(6, 2, 128)
    cache = torch.empty(4, 16, 2, 128)
    attention.paged_prefill_attention(q, cache, cache, table, qsl, seq_lens, 0.1, q)
    q = torch.empty(3, 16, 80, dtype=torch.bfloat16)
    cache = torch.empty(4, 16, 2, 80, dtype=torch.bfloat16)
    attention.paged_prefill_attention(q, cache, cache, table[:1], qsl[:2], seq_lens[:1], 0.1, q)
    attention.paged_decode_attention(q[:2], cache, cache, table, seq_lens, 0.1, q[:2])
    x = torch.empty(2, 8192, dtype=torch.bfloat16)
    layernorm.rms_norm(x, torch.empty(8192), 1e-6, x)
    activation.silu_and_mul(x, x[:, :4096])
    rotary.rotary_embedding(
        torch.zeros(2, dtype=torch.int64), x[:, :4096], x[:, 4096:5120],
        torch.empty(8, 128), 128, True,
    )
    print("compiled")
    """
)


@pytest.mark.slow
def test_kernels_compile_for_sm86_and_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("compiled")
