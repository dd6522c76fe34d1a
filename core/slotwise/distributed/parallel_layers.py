"""Tensor-parallel layers: each rank holds a slice of the weights, collectives join them.

The Megatron split: column-parallel layers shard the output features, row-parallel
ones the input features and all-reduce their partial sums, so a chained pair costs one
all-reduce; embedding and LM head shard the vocabulary.  Without ``init_distributed``
every layer computes what its ``torch.nn`` counterpart does.

Weights load from unsharded tensors, so every rank reads the same checkpoint:
``load_full_weight(weight, bias)`` takes whole tensors, ``load_shard(name, tensor,
part)`` indexes only this rank's rows or columns of one checkpoint tensor (``part``
picks q, k or v, gate or up), and ``full_shape(name, part)`` is the shape it must have.
The collectives are ``torch.ops.slotwise.tp_*`` custom ops, so the layers compile with
``fullgraph=True``.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from slotwise.distributed.ops import tp_all_gather
from slotwise.distributed.state import (
    TP_GROUP,
    get_tensor_parallel_rank,
    get_tensor_parallel_world_size,
)


class Sliceable(Protocol):
    """An unsharded tensor read on demand: a ``torch.Tensor``, or a checkpoint's tensor
    whose indexing (or ``copy_to(dest, index)``) reads only the indexed bytes."""

    def __getitem__(self, index: Any) -> torch.Tensor: ...


def _copy_slice(dest: torch.Tensor, tensor: Sliceable, index: Any = None) -> None:
    """Copy ``tensor[index]`` (all of ``tensor`` for None) into ``dest``: through
    ``tensor.copy_to`` where it has one, with no copy of the slice on the way."""
    copy_to = getattr(tensor, "copy_to", None)
    if copy_to is not None:
        copy_to(dest, index)
    else:
        dest.copy_(tensor[... if index is None else index])


def _divide(value: int, tp_size: int, what: str) -> int:
    if value % tp_size:
        raise ValueError(
            f"{what} ({value}) is not divisible by the tensor-parallel size {tp_size}; "
            "choose a tensor_parallel_size that divides it"
        )
    return value // tp_size


def _all_reduced(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the tensor-parallel group, through the out variant, so a
    static graph split at the all-reduce allocates the buffer in the piece before it."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    torch.ops.slotwise.tp_all_reduce.out(x, TP_GROUP, out=out)
    return out


def _linear_parameters(
    rows: int, columns: int, input_size: int, bias: bool, dtype: torch.dtype | None
) -> tuple[nn.Parameter, nn.Parameter | None]:
    """A weight (and bias) drawn from ``nn.Linear``'s initial distribution."""
    bound = 1 / math.sqrt(input_size)
    weight = nn.Parameter(torch.empty(rows, columns, dtype=dtype).uniform_(-bound, bound))
    if not bias:
        return weight, None
    return weight, nn.Parameter(torch.empty(rows, dtype=dtype).uniform_(-bound, bound))


def _check_full(tensor: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(
            f"{what} must be the unsharded tensor of shape {shape}, got {tuple(tensor.shape)}"
        )


class _OutputShardedLinear(nn.Module):
    """A linear layer holding one ``(start, length)`` range of the full weight's rows per
    part (``part_sizes`` rows each: q, k, v; gate, up), concatenated."""

    def __init__(
        self,
        input_size: int,
        part_sizes: list[int],
        shard_rows: list[tuple[int, int]],
        bias: bool,
        params_dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        self.tp_rank = get_tensor_parallel_rank()
        self.tp_size = get_tensor_parallel_world_size()
        self.input_size = input_size
        self.output_size = sum(part_sizes)
        self.part_sizes = part_sizes
        self.shard_rows = shard_rows
        rows = sum(length for _, length in shard_rows)
        self.weight, self.bias = _linear_parameters(
            rows, input_size, input_size, bias, params_dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @torch.no_grad()
    def load_full_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Keep this rank's rows of the unsharded ``weight`` (and ``bias``), all parts."""
        _check_full(weight, (self.output_size, self.input_size), "weight")
        if bias is not None:
            if self.bias is None:
                raise ValueError(f"{type(self).__name__} was built with bias=False")
            _check_full(bias, (self.output_size,), "bias")
        offset = 0
        for part, size in enumerate(self.part_sizes):
            self.load_shard("weight", weight[offset : offset + size], part)
            if bias is not None:
                self.load_shard("bias", bias[offset : offset + size], part)
            offset += size

    def full_shape(self, name: str, part: int = 0) -> tuple[int, ...]:
        """The shape of part ``part`` of parameter ``name`` ("weight" or "bias"), unsharded."""
        size = self.part_sizes[part]
        return (size, self.input_size) if name == "weight" else (size,)

    @torch.no_grad()
    def load_shard(self, name: str, tensor: Sliceable, part: int = 0) -> None:
        """Copy this rank's rows of the unsharded ``tensor`` of part ``part`` into its
        place in parameter ``name``; only those rows are indexed."""
        start, length = self.shard_rows[part]
        start -= sum(self.part_sizes[:part])
        local = sum(rows for _, rows in self.shard_rows[:part])
        _copy_slice(
            getattr(self, name)[local : local + length], tensor, slice(start, start + length)
        )

    def extra_repr(self) -> str:
        return (
            f"in={self.input_size}, out={self.output_size}, local_out={self.weight.shape[0]}, "
            f"bias={self.bias is not None}, tp={self.tp_rank}/{self.tp_size}"
        )


class ColumnParallelLinear(_OutputShardedLinear):
    """``nn.Linear`` whose output features are split evenly across the ranks
    (``gather_output=True`` all-gathers the full output)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        *,
        gather_output: bool = False,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        tp_rank, tp_size = get_tensor_parallel_rank(), get_tensor_parallel_world_size()
        per_rank = _divide(output_size, tp_size, "output_size")
        super().__init__(
            input_size, [output_size], [(tp_rank * per_rank, per_rank)], bias, params_dtype
        )
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output and self.tp_size > 1:
            y = tp_all_gather(y, -1, TP_GROUP)
        return y


class MergedColumnParallelLinear(_OutputShardedLinear):
    """Several column-parallel outputs in one matmul, each split across the ranks: for
    gate and up, this rank's gate slice then its up slice, as ``SiluAndMul`` expects."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        tp_rank, tp_size = get_tensor_parallel_rank(), get_tensor_parallel_world_size()
        shard_rows, offset = [], 0
        for index, size in enumerate(output_sizes):
            per_rank = _divide(size, tp_size, f"output_sizes[{index}]")
            shard_rows.append((offset + tp_rank * per_rank, per_rank))
            offset += size
        super().__init__(input_size, list(output_sizes), shard_rows, bias, params_dtype)
        self.output_sizes = list(output_sizes)


class QKVParallelLinear(_OutputShardedLinear):
    """The fused query/key/value projection with attention heads split across ranks.

    With fewer key/value heads than ranks each is replicated on ``tp /
    total_num_kv_heads`` ranks.  ``num_heads``, ``num_kv_heads``, ``q_size`` and
    ``kv_size`` are per rank: split the output with ``[q_size, kv_size, kv_size]``.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
        *,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        tp_rank, tp_size = get_tensor_parallel_rank(), get_tensor_parallel_world_size()
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        num_heads = _divide(total_num_heads, tp_size, "total_num_heads")
        if total_num_kv_heads >= tp_size:
            num_kv_heads = _divide(total_num_kv_heads, tp_size, "total_num_kv_heads")
            first_kv_head = tp_rank * num_kv_heads
        elif tp_size % total_num_kv_heads == 0:
            num_kv_heads = 1
            first_kv_head = tp_rank // (tp_size // total_num_kv_heads)
        else:
            raise ValueError(
                f"total_num_kv_heads ({total_num_kv_heads}) is smaller than the tensor-parallel "
                f"size {tp_size} but does not divide it, so its heads cannot be replicated "
                "evenly; choose a tensor_parallel_size that is a multiple of it"
            )
        q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
        total_q, total_kv = total_num_heads * head_size, total_num_kv_heads * head_size
        kv_start = first_kv_head * head_size
        shard_rows = [
            (tp_rank * q_size, q_size),
            (total_q + kv_start, kv_size),
            (total_q + total_kv + kv_start, kv_size),
        ]
        super().__init__(hidden_size, [total_q, total_kv, total_kv], shard_rows, bias, params_dtype)
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.q_size = q_size
        self.kv_size = kv_size


class RowParallelLinear(nn.Module):
    """``nn.Linear`` whose input features are split across the ranks, the partial sums
    all-reduced and the bias added once; ``input_is_parallel=False`` slices the input."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        *,
        input_is_parallel: bool = True,
        params_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp_rank = get_tensor_parallel_rank()
        self.tp_size = get_tensor_parallel_world_size()
        self.input_size = input_size
        self.output_size = output_size
        self.input_size_per_partition = _divide(input_size, self.tp_size, "input_size")
        self.input_is_parallel = input_is_parallel
        self.weight, self.bias = _linear_parameters(
            output_size, self.input_size_per_partition, input_size, bias, params_dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.linear(x, self.weight, self.bias)
        if not self.input_is_parallel:
            x = x.narrow(
                -1, self.tp_rank * self.input_size_per_partition, self.input_size_per_partition
            )
        y = _all_reduced(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    @torch.no_grad()
    def load_full_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Keep this rank's columns of the unsharded ``weight``; the bias is not split."""
        _check_full(weight, (self.output_size, self.input_size), "weight")
        self.load_shard("weight", weight)
        if bias is not None:
            if self.bias is None:
                raise ValueError("RowParallelLinear was built with bias=False")
            _check_full(bias, (self.output_size,), "bias")
            self.load_shard("bias", bias)

    def full_shape(self, name: str, part: int = 0) -> tuple[int, ...]:
        """The shape of parameter ``name`` ("weight" or "bias"), unsharded."""
        return (self.output_size, self.input_size) if name == "weight" else (self.output_size,)

    @torch.no_grad()
    def load_shard(self, name: str, tensor: Sliceable, part: int = 0) -> None:
        """Copy this rank's columns of the unsharded weight (the whole bias, which is
        not split) into parameter ``name``; only those columns are indexed."""
        if name == "bias":
            _copy_slice(self.bias, tensor)
        else:
            start = self.tp_rank * self.input_size_per_partition
            columns = slice(start, start + self.input_size_per_partition)
            _copy_slice(self.weight, tensor, (slice(None), columns))

    def extra_repr(self) -> str:
        return (
            f"in={self.input_size}, local_in={self.input_size_per_partition}, "
            f"out={self.output_size}, bias={self.bias is not None}, "
            f"tp={self.tp_rank}/{self.tp_size}"
        )


class VocabParallelEmbedding(nn.Module):
    """``nn.Embedding`` with the vocabulary split across the ranks: rank r holds rows
    ``[r * n, (r + 1) * n)``, ``n = ceil(vocab / tp)``, zero past the vocabulary, and a
    token held elsewhere embeds to zeros here, so the all-reduce is the embedding."""

    def __init__(
        self, num_embeddings: int, embedding_dim: int, *, params_dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.tp_rank = get_tensor_parallel_rank()
        self.tp_size = get_tensor_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start = min(self.tp_rank * self.num_embeddings_per_partition, num_embeddings)
        self.vocab_end = min(self.vocab_start + self.num_embeddings_per_partition, num_embeddings)
        weight = torch.empty(self.num_embeddings_per_partition, embedding_dim, dtype=params_dtype)
        if not weight.is_meta:  # a model built on meta is given its weights later
            weight.normal_()  # nn.Embedding's initial distribution
            weight[self.vocab_end - self.vocab_start :] = 0
        self.weight = nn.Parameter(weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(mine, input_ids - self.vocab_start, 0)
        embedded = F.embedding(local_ids, self.weight).masked_fill(~mine.unsqueeze(-1), 0)
        return _all_reduced(embedded)

    @torch.no_grad()
    def load_full_weight(self, weight: torch.Tensor) -> None:
        """Keep this rank's rows of the unsharded ``(num_embeddings, embedding_dim)`` weight."""
        _check_full(weight, (self.num_embeddings, self.embedding_dim), "weight")
        self.load_shard("weight", weight)

    def full_shape(self, name: str = "weight", part: int = 0) -> tuple[int, ...]:
        """The shape of the unsharded ``(num_embeddings, embedding_dim)`` table."""
        return (self.num_embeddings, self.embedding_dim)

    @torch.no_grad()
    def load_shard(self, name: str, tensor: Sliceable, part: int = 0) -> None:
        """Copy this rank's rows of the unsharded table; only those rows are indexed."""
        rows = self.vocab_end - self.vocab_start
        _copy_slice(self.weight[:rows], tensor, slice(self.vocab_start, self.vocab_end))
        self.weight[rows:] = 0

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, "
            f"local=[{self.vocab_start}, {self.vocab_end}), tp={self.tp_rank}/{self.tp_size}"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection to vocabulary logits, the vocabulary split across ranks and
    all-gathered; its weight has the embedding's layout, so the two can be tied."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        if self.tp_size == 1:
            return logits
        logits = tp_all_gather(logits, -1, TP_GROUP)
        # Padding rows sit after the last real token, so the vocabulary comes first.
        return logits[..., : self.num_embeddings]
