"""The paged KV cache: fixed-size blocks of tokens, handed out per request.

A request's tokens live in the blocks of its block table, in order: token ``pos``
sits in block ``block_ids[pos // block_size]`` at offset ``pos % block_size``, i.e.
at slot ``block_id * block_size + offset`` of the cache seen as one long row of
slots.  Blocks need not be contiguous, so requests grow without copying.
"""

from __future__ import annotations

import collections
import functools
import weakref
from collections.abc import Iterable, Sequence

import torch

from slotwise.errors import SlotwiseError


class OutOfBlocksError(SlotwiseError, RuntimeError):
    """The cache has no free block left; a scheduler preempts or waits on this."""


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def compute_slot_mapping(block_ids: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions ``start..end-1`` of a request stored in ``block_ids``."""
    return [
        block_ids[pos // block_size] * block_size + pos % block_size for pos in range(start, end)
    ]


class BlockAllocator:
    """Hands out the block ids of a cache with ``num_blocks`` blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = collections.deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num_tokens: int, block_ids: list[int] | None = None) -> list[int]:
        """Extend ``block_ids`` (in place; a new list when None) to hold ``num_tokens`` tokens."""
        block_ids = [] if block_ids is None else block_ids
        missing = num_blocks_for(num_tokens, self.block_size) - len(block_ids)
        if missing > len(self._free):
            raise OutOfBlocksError(
                f"{num_tokens} tokens need {missing} more blocks of {self.block_size}, "
                f"but only {len(self._free)} of {self.num_blocks} are free; free finished "
                "requests or allocate a larger cache"
            )
        for _ in range(max(missing, 0)):
            block = self._free.popleft()
            self._used.add(block)
            block_ids.append(block)
        return block_ids

    def allocate_all(self, num_tokens: Sequence[int]) -> list[list[int]]:
        """New blocks for requests of ``num_tokens[i]`` tokens each, for all or for none:
        a batch that only partly fits would hold blocks that nobody frees."""
        needed = sum(num_blocks_for(n, self.block_size) for n in num_tokens)
        if needed > len(self._free):
            raise OutOfBlocksError(
                f"{len(num_tokens)} requests of {sum(num_tokens)} tokens need {needed} "
                f"blocks of {self.block_size}, but only {len(self._free)} of "
                f"{self.num_blocks} are free; free finished requests, send fewer at once "
                "or allocate a larger cache"
            )
        return [self.allocate(n) for n in num_tokens]

    def free(self, block_ids: Iterable[int]) -> None:
        for block in block_ids:
            if block not in self._used:
                raise ValueError(f"block {block} is not allocated (freed twice?)")
            self._used.remove(block)
            self._free.append(block)


def write_to_kv_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store ``key``/``value`` [num_tokens, num_kv_heads, head_size] at ``slot_mapping``.

    Rows past ``len(slot_mapping)`` (padding to a static-graph size) are not stored, so
    callers need not slice them off first.  ``kv_cache`` is [2, num_blocks, block_size,
    num_kv_heads, head_size]; its layout is checked and its two halves are flattened
    into rows of slots once per cache (see ``_TokenSlots``), so a call is the two copies.
    """
    slots = _token_slots.get(id(kv_cache))
    if slots is None or slots.cache() is not kv_cache or slots.address != kv_cache.data_ptr():
        slots = _TokenSlots.bind(kv_cache)
    count = slot_mapping.shape[0]
    if key.shape[0] != count:
        key, value = key[:count], value[:count]
    if (key.requires_grad or value.requires_grad) and torch.is_grad_enabled():
        # Autograd records the write: a view written in place once may not be again.
        halves = kv_cache.view(2, *slots.keys.shape)
        halves[0].index_copy_(0, slot_mapping, key)
        halves[1].index_copy_(0, slot_mapping, value)
        return
    slots.keys.index_copy_(0, slot_mapping, key)
    slots.values.index_copy_(0, slot_mapping, value)


class _TokenSlots:
    """A cache's key and value halves as rows of slots, ``[num_blocks * block_size,
    num_kv_heads, head_size]``, kept from one write to the next.

    Why kept: taking the halves costs three view ops, more than a copy of one token.
    They are made from ``kv_cache.detach()``, not from the cache itself, so they do not
    keep the cache's Python object alive: when it is freed, a weak reference's callback
    drops them and the memory goes with the cache.  ``address`` notices a cache whose
    memory was swapped in place (``set_``).
    """

    def __init__(self, kv_cache: torch.Tensor) -> None:
        if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
            raise ValueError(
                f"write_to_kv_cache: kv_cache has shape {tuple(kv_cache.shape)}, not [2, "
                "num_blocks, block_size, num_kv_heads, head_size] (keys, then values); a "
                "backend with another layout writes its cache itself"
            )
        self.cache = weakref.ref(kv_cache, functools.partial(_forget, id(kv_cache)))
        self.address = kv_cache.data_ptr()
        _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
        halves = kv_cache.detach().view(2, num_blocks * block_size, num_kv_heads, head_size)
        self.keys, self.values = halves[0], halves[1]

    @classmethod
    def bind(cls, kv_cache: torch.Tensor) -> _TokenSlots:
        slots = _token_slots[id(kv_cache)] = cls(kv_cache)
        return slots


#: id(kv_cache) -> its slots, while the cache lives.
_token_slots: dict[int, _TokenSlots] = {}


def _forget(key: int, cache: weakref.ref[torch.Tensor]) -> None:
    """Drop the slots of the cache ``cache`` referred to, now freed (not of a newer one
    that took its id)."""
    slots = _token_slots.get(key)
    if slots is not None and slots.cache is cache:
        del _token_slots[key]
