"""``AttentionBackend``: what one attention implementation supports and which classes make it up.

A backend is a class with class-level facts (dtypes, head sizes, block sizes, how it
behaves inside static graphs) and class methods naming its implementation and its
metadata builder.  Selection only reads these facts, so choosing a backend never
runs a kernel; ``validate`` turns the facts into reasons a backend was rejected.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from slotwise.attention.metadata import AttentionMetadataBuilder

if TYPE_CHECKING:
    from slotwise.attention.impl import AttentionImpl


class GraphSupport(enum.Enum):
    """Which static-graph modes (CUDA graphs, NPU graphs) a backend tolerates."""

    #: Runs eagerly between captured pieces (the attention op is a splitting op), never
    #: inside a graph: what a backend that synchronises or allocates per call declares.
    PIECEWISE_ONLY = "piecewise_only"
    #: May also be captured inside a FULL graph of a uniform-decode batch (one new
    #: token per request), laid out by ``StaticAttentionMetadata.uniform_decode``:
    #: enough for FULL_AND_PIECEWISE, where mixed batches run between pieces.
    UNIFORM_DECODE = "uniform_decode"
    #: May be captured inside a FULL graph of any batch, laid out by
    #: ``StaticAttentionMetadata.general`` (requests of query length 0 included).
    ALWAYS = "always"

    def captures(self, uniform_decode_only: bool) -> bool:
        """Whether FULL graphs of these batches may contain this backend's attention."""
        if uniform_decode_only:
            return self in (GraphSupport.UNIFORM_DECODE, GraphSupport.ALWAYS)
        return self == GraphSupport.ALWAYS


class AttentionBackend:
    """Base class of attention backends; subclasses override the class attributes and methods.

    ``None`` in a ``supported_*`` attribute means "any value".
    """

    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.float16,
        torch.bfloat16,
        torch.float32,
    )
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = None
    supported_block_sizes: ClassVar[tuple[int, ...] | None] = None
    graph_support: ClassVar[GraphSupport] = GraphSupport.PIECEWISE_ONLY

    @classmethod
    def get_name(cls) -> str:
        """Name users give in SLOTWISE_ATTENTION_BACKEND, e.g. "CPU_SDPA"."""
        raise NotImplementedError(f"{cls.__qualname__} must implement get_name()")

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        raise NotImplementedError(f"{cls.__qualname__} must implement get_impl_cls()")

    @classmethod
    def get_builder_cls(cls) -> type[AttentionMetadataBuilder]:
        """Override to add backend-specific fields to the metadata."""
        return AttentionMetadataBuilder

    @classmethod
    def get_kv_cache_shape(
        cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """Shape of one layer's cache; index 0 holds keys, index 1 values."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def validate(
        cls,
        head_size: int | None = None,
        dtype: torch.dtype | None = None,
        block_size: int | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Why this backend cannot serve these requirements; empty when it can.

        A requirement that is ``None`` or unknown to the backend is not checked, so
        slotwise can add requirements without breaking older backends.
        """
        reasons = []
        if dtype is not None and dtype not in cls.supported_dtypes:
            reasons.append(f"dtype {dtype} not in {_listing(cls.supported_dtypes)}")
        if head_size is not None and not _allows(cls.supported_head_sizes, head_size):
            reasons.append(f"head size {head_size} not in {_listing(cls.supported_head_sizes)}")
        if block_size is not None and not _allows(cls.supported_block_sizes, block_size):
            reasons.append(f"block size {block_size} not in {_listing(cls.supported_block_sizes)}")
        return reasons


def _allows(supported: tuple[int, ...] | None, value: int) -> bool:
    return supported is None or value in supported


def _listing(values: tuple[Any, ...] | None) -> str:
    return "(" + ", ".join(str(v) for v in values or ()) + ")"
