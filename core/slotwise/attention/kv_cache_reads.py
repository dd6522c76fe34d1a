"""Which KV caches a block of code reads: a FULL graph captures attention, so it replays
on the caches its capture read, and must not once ``allocate_kv_caches`` replaced them."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

#: Layer -> the data address of the cache it read; the observed layers only.
KVCacheReads = list[tuple[weakref.ref[Any], int]]

_observing = threading.local()


@contextlib.contextmanager
def kv_cache_reads() -> Iterator[KVCacheReads]:
    """The attention layers' caches read inside the block (``note_kv_cache_read``)."""
    reads: KVCacheReads = []
    previous = getattr(_observing, "reads", None)
    _observing.reads = reads
    try:
        yield reads
    finally:
        _observing.reads = previous


def note_kv_cache_read(layer: Any, cache: torch.Tensor) -> None:
    """``layer`` reads ``cache`` now; recorded inside ``kv_cache_reads`` only."""
    reads = getattr(_observing, "reads", None)
    if reads is not None:
        reads.append((weakref.ref(layer), cache.data_ptr()))


def kv_caches_replaced(reads: KVCacheReads) -> bool:
    """Whether a layer of ``reads`` holds another cache now (or is gone)."""
    for layer_ref, address in reads:
        layer = layer_ref()
        cache = None if layer is None else layer.kv_cache
        if cache is None or cache.data_ptr() != address:
            return True
    return False
