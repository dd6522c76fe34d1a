"""``TRITON_PAGED``: paged attention with the Triton kernels of ``slotwise_cuda.kernels``.

A mixed batch is ``[decodes..., prefills...]``, so the head goes to the decode
kernel (one query token per sequence) and the tail to the prefill kernel, each on
a slice of the same tensors: nothing is gathered or reordered.  The kernels module (and
Triton) is imported on the first forward, not when the backend is selected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from slotwise.plugin_api import (
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    GraphSupport,
    write_to_kv_cache,
)

if TYPE_CHECKING:
    from slotwise.plugin_api import BatchSplit


class TritonPagedBackend(AttentionBackend):
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    # The kernels pad the head size to a power of two; these are the sizes checked
    # against the reference implementation.
    supported_head_sizes = (32, 64, 80, 96, 112, 128, 256)
    # Neither kernel reads the device on the host, and the prefill kernel's grid
    # depends on tensor shapes alone, so the launches can be captured.  The
    # decode/prefill split is a host value baked into a graph: full graphs of mixed
    # batches get StaticAttentionMetadata.general, where every request is a "prefill"
    # (requests of query length 0 included) and the prefill kernel runs them all.
    graph_support = GraphSupport.ALWAYS

    @classmethod
    def get_name(cls) -> str:
        return "TRITON_PAGED"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return TritonPagedImpl


class TritonPagedImpl(AttentionImpl):
    """Per layer and step: one copy into the cache, one launch per part of the batch.

    What is the same for every layer of a step is worked out by the first layer only:
    the decode/prefill views (``metadata.split``) and the checked, configured launches
    (keyed by the layout of the layer's tensors, so a layer laid out differently gets
    its own checks).  Each layer then binds its calls to its own tensors once: the
    copies of its keys and values into the cache and its launches, with every argument
    in place (``_LayerCalls``).  Both live in ``metadata.layout_cache``, so they serve
    every later step a runner makes over the same metadata object (a step of the same
    shape over the same buffers, rewritten in place) for as long as the layer's tensors
    and cache are the ones they were bound to.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (kv_cache, its address, its key half, its value half, both as rows of
        #: slots): unbound once per cache.
        self._halves: tuple[Any, ...] | None = None

    def forward(
        self,
        layer: Attention,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        calls = metadata.layout_cache.get(self)
        if calls is not None and calls.serves(q, k, v, kv_cache, output):
            calls.run()
            return
        metadata.layout_cache[self] = self._bind_and_run(q, k, v, kv_cache, metadata, output)

    def bind(
        self,
        layer: Attention,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        output: torch.Tensor,
    ) -> Callable[[], None]:
        """The layer's calls bound to these tensors, once a forward bound them."""
        calls = metadata.layout_cache.get(self)
        if calls is not None and calls.serves(q, k, v, kv_cache, output):
            return calls.run
        return super().bind(layer, q, k, v, kv_cache, metadata, output)

    def _bind_and_run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        output: torch.Tensor,
    ) -> _LayerCalls:
        """This layer's calls on these tensors, made once now (binding the launches)."""
        key_cache, value_cache, key_slots, value_slots = self._cache_halves(kv_cache)
        slot_mapping = metadata.slot_mapping
        count = slot_mapping.shape[0]
        calls: list[Callable[[], Any]] = []
        if k.requires_grad or v.requires_grad:
            # Autograd may record the write: the core's write_to_kv_cache knows when.
            calls.append(functools.partial(write_to_kv_cache, k, v, kv_cache, slot_mapping))
        else:
            for slots, new in ((key_slots, k), (value_slots, v)):
                rows = _rows(new, 0, count)
                calls.append(functools.partial(slots.index_copy_, 0, slot_mapping, rows))
        if q.stride(-1) != 1:  # the kernels take strided rows and heads, not strided values
            dense = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            calls.append(functools.partial(dense.copy_, q))
        else:
            dense = q
        for call in calls:
            call()
        split = metadata.split
        decodes = metadata.num_decodes  # one token each: rows 0..decodes-1
        parts = []
        if decodes:
            parts.append((0, decodes, split.decode_block_table, split.decode_seq_lens, None))
        if metadata.num_prefills:
            parts.append(
                (
                    decodes,
                    metadata.num_actual_tokens,
                    split.prefill_block_table,
                    split.prefill_seq_lens,
                    split.prefill_query_start_loc,
                )
            )
        for start, stop, block_table, seq_lens, query_start_loc in parts:
            rows_q, rows_out = _rows(dense, start, stop), _rows(output, start, stop)
            decode = query_start_loc is None
            launch = _bound(metadata, rows_q, kv_cache, rows_out, split, decode=decode)
            arguments = (
                rows_q,
                key_cache,
                value_cache,
                block_table,
                seq_lens,
                rows_out,
                self.scale,
                query_start_loc,
            )
            launch(*arguments)  # binds the compiled kernel on its first launch
            calls.append(launch.bind(*arguments))
        return _LayerCalls(q, k, v, kv_cache, output, calls)

    def _cache_halves(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The cache's key and value halves, then the same as rows of slots."""
        halves = self._halves
        if halves is None or halves[0] is not kv_cache or halves[1] != kv_cache.data_ptr():
            if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
                raise ValueError(
                    f"TRITON_PAGED: kv_cache has shape {tuple(kv_cache.shape)}, not [2, "
                    "num_blocks, block_size, num_kv_heads, head_size]; allocate it with "
                    "slotwise.attention.allocate_kv_caches"
                )
            key_cache, value_cache = kv_cache.unbind(0)
            two, num_blocks, block_size, *token = kv_cache.shape
            key_slots, value_slots = kv_cache.detach().view(two, num_blocks * block_size, *token)
            halves = self._halves = (
                kv_cache,
                kv_cache.data_ptr(),
                key_cache,
                value_cache,
                key_slots,
                value_slots,
            )
        return halves[2:]


class _LayerCalls:
    """One layer's calls of a step, bound to its tensors: the KV copies and launches
    (and the copy of a q strided in its last dimension into a dense one)."""

    __slots__ = ("address", "calls", "k", "kv_cache", "out", "q", "v")

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        out: torch.Tensor,
        calls: list[Callable[[], Any]],
    ) -> None:
        self.q, self.k, self.v, self.out = q, k, v, out
        self.kv_cache = kv_cache
        #: A cache whose memory is swapped in place (``set_``) is another cache.
        self.address = kv_cache.data_ptr()
        self.calls = tuple(calls)

    def serves(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        out: torch.Tensor,
    ) -> bool:
        """Whether these are the tensors the calls were bound to."""
        return (
            q is self.q
            and k is self.k
            and v is self.v
            and out is self.out
            and kv_cache is self.kv_cache
            and kv_cache.data_ptr() == self.address
        )

    def run(self) -> None:
        for call in self.calls:
            call()


def _rows(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop``; the tensor itself when that is all of it (a slice costs a
    microsecond or two, paid per layer and step)."""
    return tensor if start == 0 and stop == tensor.shape[0] else tensor[start:stop]


def _bound(
    metadata: AttentionMetadata,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    out: torch.Tensor,
    split: BatchSplit,
    *,
    decode: bool,
) -> Any:
    """The step's checked launch for tensors laid out as these, bound on first use and
    kept in ``metadata.layout_cache`` (it reads the layout of the metadata's tensors,
    never what they hold)."""
    key = (
        decode,
        q.shape,
        q.stride(),
        q.dtype,
        q.device,
        out.shape,
        out.stride(),
        out.dtype,
        out.device,
        kv_cache.shape,
        kv_cache.stride(),
        kv_cache.dtype,
        kv_cache.device,
    )
    launch = metadata.layout_cache.get(key)
    if launch is None:
        key_cache, value_cache = kv_cache.unbind(0)
        kernels = _kernels()
        if decode:
            launch = kernels.PagedAttentionLaunch(
                q, key_cache, value_cache, split.decode_block_table, split.decode_seq_lens, out
            )
        else:
            launch = kernels.PagedAttentionLaunch(
                q,
                key_cache,
                value_cache,
                split.prefill_block_table,
                split.prefill_seq_lens,
                out,
                split.prefill_query_start_loc,
            )
        metadata.layout_cache[key] = launch
    return launch


@functools.cache
def _kernels() -> ModuleType:
    """The kernels module, imported (with Triton) on the first forward."""
    from slotwise_cuda.kernels import attention

    return attention
