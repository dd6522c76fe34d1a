"""``torch.ops.slotwise_cpu.paged_decode``: decode attention read straight from the paged
KV cache, by the plugin's C kernel (``csrc/paged_decode.c``).

Why: gathering every request's blocks into a dense copy before SDPA reads each cached
byte three times (the gather reads and writes it, SDPA reads the copy) and pads every
request to the longest.  The kernel reads each request's own tokens once, in place, so a
step's attention costs what its keys and values weigh.  It can also store the step's new
keys and values first, which saves a decode step the separate cache write.

The op's kernel is the C++ one in ``csrc/ops.cpp``, which checks every layout the kernel
reads through raw pointers (a wrong one raises ``ValueError`` naming it) and leaves block
ids, slots and lengths to the kernel's own checks.  Until that library is loaded, a
Python stand-in loads it and calls the op again; where it cannot be built, the stand-in
raises, and ``CPU_SDPA`` (which asks ``available()`` first) gathers instead.

Arguments: q, out [num_seqs, num_heads, head_size] (rows may be strided, heads
contiguous); kv_cache [2, num_blocks, num_kv_heads, block_size, head_size], keys then
values, contiguous (the layer's cache as ``CPU_SDPA`` allocates it: head-major blocks);
block_table int32 [num_seqs, >= blocks needed]; seq_lens int32 [num_seqs], the tokens
each query attends to, its own included; optionally the new keys and values [num_new,
num_kv_heads, head_size] with their int64 slot_mapping [num_new], stored first.
"""

from __future__ import annotations

import torch

from slotwise_cpu import native

#: The op's qualified name.
PAGED_DECODE_OP = "slotwise_cpu::paged_decode"
#: The dtypes the kernel reads and writes.
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_library = torch.library.Library("slotwise_cpu", "FRAGMENT")
_library.define(
    "paged_decode(Tensor q, Tensor(a!) kv_cache, Tensor block_table, Tensor seq_lens, "
    "Tensor(b!) out, float scale, Tensor? new_keys=None, Tensor? new_values=None, "
    "Tensor? slot_mapping=None) -> ()"
)
#: The op, to call: ``paged_decode_op(q, kv_cache, block_table, seq_lens, out, scale, ...)``.
paged_decode_op = torch.ops.slotwise_cpu.paged_decode.default


def available() -> bool:
    """Whether the op has its kernel here (``load_kernels`` warned once if not)."""
    return native.load_kernels() is not None


def _paged_decode_before_the_kernels(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    new_keys: torch.Tensor | None = None,
    new_values: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> None:
    """The op's kernel where the C++ one is not registered: on the first CPU call, load
    the kernels library and call the op again; otherwise a clear error."""
    if q.device.type != "cpu":
        raise ValueError(f"slotwise_cpu.paged_decode takes CPU tensors; got q on {q.device}")
    if not available():
        raise native.KernelBuildError(
            "slotwise_cpu.paged_decode needs the CPU plugin's kernels, which could not be "
            "built here (the slotwise_cpu warning logged before says why); CPU_SDPA gathers "
            "each request's cache blocks instead"
        )
    paged_decode_op(
        q, kv_cache, block_table, seq_lens, out, scale, new_keys, new_values, slot_mapping
    )


_library.impl("paged_decode", _paged_decode_before_the_kernels, "CompositeExplicitAutograd")


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the kernel reads these dtypes (the op checks the layouts)."""
    return q.dtype in DTYPES and kv_cache.dtype == q.dtype
