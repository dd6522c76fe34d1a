"""Decode attention read straight from the paged KV cache, by the plugin's C kernel.

Why: gathering every request's blocks into a dense copy before SDPA reads each cached
byte three times (the gather reads and writes it, SDPA reads the copy) and pads every
request to the longest.  ``csrc/paged_decode.c`` reads each request's own tokens once,
in place, so a step's attention costs what its keys and values weigh.  It can also
store the step's new keys and values first, which saves a decode step the separate
cache write.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from slotwise_cpu.native import kernel_function

#: The kernel's dtype codes.
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
#: What the kernel's status codes mean.
_STATUS = {
    1: "bad sizes (heads not a multiple of key/value heads, or an empty dimension)",
    2: "a block id or slot outside the cache, or a sequence longer than its block table row",
    3: "out of memory for the partitions' partial results",
}


@functools.cache
def kernel() -> ctypes._CFuncPtr | None:
    """The C function, or None (with one warning saying why) when it cannot be built."""
    argtypes = [
        _PTR, _I64, _I64,  # q, its strides
        _PTR, _PTR, _I64,  # key and value cache, their blocks
        _PTR, _I64, _I64,  # block table, its row stride and width
        _PTR,  # seq_lens
        _PTR, _I64, _I64,  # out, its strides
        _I64, _I64, _I64, _I64, _I64,  # seqs, heads, kv heads, head size, block size
        ctypes.c_float, ctypes.c_int, ctypes.c_int,  # scale, dtype code, threads
        _PTR, _I64, _PTR, _I64,  # new keys and values, their row strides
        _PTR, _I64,  # their slots, their count
    ]  # fmt: skip
    return kernel_function(
        "paged_decode",
        "slotwise_paged_decode",
        argtypes,
        "decode attention gathers each request's cache blocks into a dense copy (slower for "
        "long contexts)",
    )


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the kernel can serve these tensors (``paged_decode`` checks the layouts)."""
    return q.dtype in DTYPE_CODES and kv_cache.dtype == q.dtype


def paged_decode(
    function: ctypes._CFuncPtr,
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    *,
    caches_checked: bool = False,
) -> None:
    """Attention of each request's one query token over its ``seq_lens[r]`` cached tokens,
    into ``out``; with ``new_kv`` (keys, values, slot_mapping), stores those first.

    q, out: [num_seqs, num_heads, head_size] (rows may be strided, heads contiguous);
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size], contiguous;
    block_table: int32 [num_seqs, >= blocks needed]; seq_lens: int32 [num_seqs];
    new keys and values: [num_new, num_kv_heads, head_size], slot_mapping int64 [num_new].
    ``caches_checked``: the caches already passed ``check_caches`` (a layer checks its
    cache once); the per-step tensors are checked on every call.
    """
    if not caches_checked:
        check_caches(key_cache, value_cache)
    num_seqs, num_heads, head_size = q.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    _check_step(q, out, key_cache, block_table, seq_lens, new_kv)
    new_keys, new_values, slots = new_kv if new_kv is not None else (None, None, None)
    status = function(
        q.data_ptr(), q.stride(0), q.stride(1),
        key_cache.data_ptr(), value_cache.data_ptr(), num_blocks,
        block_table.data_ptr(), block_table.stride(0), block_table.shape[1],
        seq_lens.data_ptr(),
        out.data_ptr(), out.stride(0), out.stride(1),
        num_seqs, num_heads, num_kv_heads, head_size, block_size,
        scale, DTYPE_CODES[q.dtype], torch.get_num_threads(),
        None if new_keys is None else new_keys.data_ptr(),
        0 if new_keys is None else new_keys.stride()[0],
        None if new_values is None else new_values.data_ptr(),
        0 if new_values is None else new_values.stride()[0],
        None if slots is None else slots.data_ptr(),
        0 if slots is None else slots.shape[0],
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"paged_decode: {_STATUS.get(status, f'status {status}')}")


def check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """The caches' layout the kernel reads through raw pointers: what
    ``paged_decode(caches_checked=True)`` assumes; a layer checks its caches once."""
    if not (
        key_cache.dtype in DTYPE_CODES
        and value_cache.dtype is key_cache.dtype
        and key_cache.dim() == 4
        and key_cache.shape == value_cache.shape
        and key_cache.is_contiguous()
        and value_cache.is_contiguous()
        and key_cache.device.type == "cpu"
        and value_cache.device.type == "cpu"
    ):
        raise ValueError(
            "paged_decode: needs contiguous CPU key and value caches of one shape "
            "[num_blocks, block_size, num_kv_heads, head_size] and one dtype of "
            f"{sorted(map(str, DTYPE_CODES))}; got {key_cache.dtype} "
            f"{tuple(key_cache.shape)} and {value_cache.dtype} {tuple(value_cache.shape)}"
        )


def _check_step(
    q: torch.Tensor,
    out: torch.Tensor,
    key_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> None:
    """The step's layouts the kernel reads through raw pointers; anything else would read
    the wrong memory rather than fail.  (Block ids, slots and lengths it checks itself.)

    Runs for every attention layer and step: one flat chain of tests, cheapest first."""
    dtype, shape = q.dtype, q.shape
    heads_contiguous = (shape[2], 1)
    kv_rows = (key_cache.shape[2], shape[2])
    ok = (
        q.stride()[1:] == heads_contiguous
        and out.dtype is dtype
        and out.shape == shape
        and out.stride()[1:] == heads_contiguous
        and key_cache.dtype is dtype
        and key_cache.shape[3] == shape[2]
        and block_table.dtype is torch.int32
        and block_table.stride()[1] == 1
        and seq_lens.dtype is torch.int32
        and seq_lens.is_contiguous()
        and q.device.type == "cpu"
    )
    if ok and new_kv is not None:
        keys, values, slots = new_kv
        ok = (
            keys.dtype is dtype
            and values.dtype is dtype
            and keys.shape[1:] == kv_rows
            and values.shape[1:] == kv_rows
            and keys.stride()[1:] == heads_contiguous
            and values.stride()[1:] == heads_contiguous
            and slots.dtype is torch.int64
            and slots.is_contiguous()
            and keys.shape[0] == values.shape[0] == slots.shape[0]
        )
    if not ok:
        raise ValueError(
            "paged_decode: needs CPU tensors of the caches' dtype and head size, heads "
            "contiguous in q, out and the new keys and values, an int32 block table with "
            "contiguous rows, int32 seq_lens and int64 slots; got q "
            f"{dtype} {tuple(q.shape)} strides {q.stride()}, out {out.dtype} "
            f"{tuple(out.shape)} strides {out.stride()}, key cache {key_cache.dtype} "
            f"{tuple(key_cache.shape)}, block table {block_table.dtype}, "
            f"seq_lens {seq_lens.dtype}"
        )
