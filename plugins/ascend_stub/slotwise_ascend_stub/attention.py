"""``ASCEND_STUB_REFERENCE``: paged attention written to be read, not to be fast.

A vendor porting slotwise starts here: this is everything an attention backend has
to do, one sequence at a time, in plain torch.  Replace the body of ``forward``
with calls to your kernels and keep the tests in tests/attention passing.

The cache of one layer is ``kv_cache[2, num_blocks, block_size, num_kv_heads,
head_size]`` (0: keys, 1: values).  The batch is ``[decodes..., prefills...]``, but
the general path does not need to care: a decode is a prefill of one token.

Batches of decodes only take a second path, written for full static graphs: no value
is read back to the host and every shape follows from the metadata's shapes, so a graph
captured for one decode step replays correctly for the next.  That is what
``GraphSupport.UNIFORM_DECODE`` promises; a backend without such a path declares
``PIECEWISE_ONLY`` and attention then always runs between graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotwise.plugin_api import (
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    GraphSupport,
    write_to_kv_cache,
)


class AscendStubReferenceBackend(AttentionBackend):
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    # The general path's loops read the metadata on the host, so only decode-only
    # batches may be captured in full graphs (graph_mode FULL_AND_PIECEWISE).
    graph_support = GraphSupport.UNIFORM_DECODE

    @classmethod
    def get_name(cls) -> str:
        return "ASCEND_STUB_REFERENCE"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return AscendStubReferenceImpl


class AscendStubReferenceImpl(AttentionImpl):
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
        if metadata.num_prefills == 0:
            self._decode(q, k, v, kv_cache, metadata, output)
            return
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        block_size = key_cache.shape[1]

        # Step 0: what every layer of the step shares (where each token goes, each
        # request's rows, blocks and causal mask) is worked out by its first layer and
        # kept in metadata.step_cache, one metadata object serving all layers of a step.
        plan = metadata.step_cache.get(("ASCEND_STUB_REFERENCE", "plan", block_size))
        if plan is None:
            plan = _StepPlan.of(metadata, block_size, q.device)
            metadata.step_cache[("ASCEND_STUB_REFERENCE", "plan", block_size)] = plan

        # Step 1: store this step's keys and values.  Token t goes to slot
        # slot_mapping[t], i.e. block slot // block_size, offset slot % block_size.
        for t, (block, offset) in enumerate(plan.slots):
            key_cache[block, offset] = k[t]
            value_cache[block, offset] = v[t]

        # Step 2: attention, one request (sequence) at a time.
        for request in plan.requests:
            # 2a: gather the request's keys and values from its blocks, in order.
            seq_len = request.seq_len  # tokens in the cache, new ones included
            keys = torch.cat([key_cache[b] for b in request.block_ids])[:seq_len]
            values = torch.cat([value_cache[b] for b in request.block_ids])[:seq_len]

            # 2b: grouped-query attention: each key/value head serves
            # num_queries_per_kv consecutive query heads.
            keys = keys.repeat_interleave(self.num_queries_per_kv, dim=1)  # [seq, heads, D]
            values = values.repeat_interleave(self.num_queries_per_kv, dim=1)

            # 2c: scores[h, i, j] = scale * q_i . k_j, in float32 for accuracy.
            query = q[request.start : request.end].float()  # [query_len, heads, D]
            scores = torch.einsum("ihd,jhd->hij", query, keys.float()) * self.scale

            # 2d: causal mask (from the plan): query token i may only look at keys at
            # positions up to its own.
            scores = scores.masked_fill(request.future, float("-inf"))

            # 2e: softmax over the keys, then the weighted sum of the values.
            probs = scores.softmax(dim=-1)
            out = torch.einsum("hij,jhd->ihd", probs, values.float())
            output[request.start : request.end] = out.to(output.dtype)

    def _decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """Steps 1 and 2 for one new token per request, all requests at once."""
        num_tokens = metadata.num_actual_tokens  # == requests: one token each

        # Step 1 with slotwise's helper, which takes the slots as a tensor (one
        # index_copy_ per cache) where the loop above reads them one by one on the host,
        # and stores only the rows slot_mapping has (padding rows are left out).
        write_to_kv_cache(k, v, kv_cache, metadata.slot_mapping)
        key_cache, value_cache = kv_cache[0], kv_cache[1]

        # Step 2: gather every block of the table (its width is fixed by the batch,
        # not by the sequence lengths), then mask the positions past each sequence.
        keys = key_cache[metadata.block_table].flatten(1, 2)  # [reqs, positions, kv_heads, D]
        values = value_cache[metadata.block_table].flatten(1, 2)
        keys = keys.repeat_interleave(self.num_queries_per_kv, dim=2)  # [reqs, pos, heads, D]
        values = values.repeat_interleave(self.num_queries_per_kv, dim=2)
        query = q[:num_tokens].float()  # [reqs, heads, D]
        scores = torch.einsum("rhd,rjhd->rhj", query, keys.float()) * self.scale
        positions = torch.arange(keys.shape[1], device=q.device)
        past_end = positions[None, None, :] >= metadata.seq_lens[:, None, None]
        probs = scores.masked_fill(past_end, float("-inf")).softmax(dim=-1)
        out = torch.einsum("rhj,rjhd->rhd", probs, values.float())
        output[:num_tokens] = out.to(output.dtype)


@dataclass(frozen=True)
class _Request:
    """One request of the step, as every layer reads it."""

    #: Its query tokens are rows start..end-1 of q and output.
    start: int
    end: int
    #: Tokens in the cache after this step, the new ones included.
    seq_len: int
    #: The blocks holding them, in order.
    block_ids: list[int]
    #: [query_len, seq_len]: True where the key lies after the query token.  Query token
    #: i sits at position context_len + i (context_len: the tokens cached before).
    future: torch.Tensor


@dataclass(frozen=True)
class _StepPlan:
    """Step 0's result: read from the metadata once, on the host, for all layers."""

    #: (block, offset) of each token's slot, in token order.
    slots: list[tuple[int, int]]
    requests: list[_Request]

    @classmethod
    def of(cls, metadata: AttentionMetadata, block_size: int, device: torch.device) -> _StepPlan:
        slots = metadata.slot_mapping[: metadata.num_actual_tokens].tolist()
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
        requests = []
        for r in range(metadata.num_reqs):
            start, end, seq_len = starts[r], starts[r + 1], seq_lens[r]
            context_len = seq_len - (end - start)
            num_blocks = (seq_len + block_size - 1) // block_size
            query_pos = torch.arange(context_len, seq_len, device=device)[:, None]
            key_pos = torch.arange(seq_len, device=device)[None, :]
            requests.append(
                _Request(
                    start=start,
                    end=end,
                    seq_len=seq_len,
                    block_ids=metadata.block_table[r, :num_blocks].tolist(),
                    future=key_pos > query_pos,
                )
            )
        return cls([divmod(slot, block_size) for slot in slots], requests)
