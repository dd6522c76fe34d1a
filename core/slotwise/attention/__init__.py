"""Paged attention: backends, their metadata, the KV cache, the layer and the custom op.

Importing this package imports torch and registers
``torch.ops.slotwise.unified_attention_with_output``; ``import slotwise`` does neither.
See docs/attention.md.
"""

from slotwise.attention.backend import AttentionBackend, GraphSupport
from slotwise.attention.cache_allocation import allocate_kv_caches
from slotwise.attention.impl import AttentionImpl
from slotwise.attention.kv_cache import (
    BlockAllocator,
    OutOfBlocksError,
    compute_slot_mapping,
    num_blocks_for,
    write_to_kv_cache,
)
from slotwise.attention.layer import Attention, get_attention_layer
from slotwise.attention.metadata import AttentionMetadata, AttentionMetadataBuilder
from slotwise.attention.ops import UNIFIED_ATTENTION_OP, unified_attention_with_output
from slotwise.attention.registry import AttentionBackendRegistry, get_attention_backend_registry
from slotwise.attention.selector import AttentionBackendError, select_attention_backend
from slotwise.attention.static_metadata import StaticAttentionMetadata

__all__ = [
    "UNIFIED_ATTENTION_OP",
    "Attention",
    "AttentionBackend",
    "AttentionBackendError",
    "AttentionBackendRegistry",
    "AttentionImpl",
    "AttentionMetadata",
    "AttentionMetadataBuilder",
    "BlockAllocator",
    "GraphSupport",
    "OutOfBlocksError",
    "StaticAttentionMetadata",
    "allocate_kv_caches",
    "compute_slot_mapping",
    "get_attention_backend_registry",
    "get_attention_layer",
    "num_blocks_for",
    "select_attention_backend",
    "unified_attention_with_output",
    "write_to_kv_cache",
]
