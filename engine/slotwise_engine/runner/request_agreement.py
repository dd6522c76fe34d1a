"""What tensor-parallel ranks must share for one ``generate`` call, and the check.

Every rank of a tensor-parallel group runs the same batch, step for step.  Ranks
given other prompts, other sampling parameters or other stopping rules run batches
of other shapes or stop at other steps: their collectives stop matching, and one of
them aborts inside the backend or waits for a peer that has gone.  So each
``generate`` call first compares (``check_ranks_agree``) the prompts' token ids, the
sampling parameters and the stopping rules.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import fields

from slotwise.distributed import Fact, check_ranks_agree, get_tp_communicator
from slotwise.distributed import state as distributed_state
from slotwise_engine.runner.sampling import SamplingParams

PROMPTS = "the prompt token ids"
SAMPLING = "the sampling parameters"
STOPPING = "the stopping rules (max_new_tokens, end-of-sequence ids, ignore_eos)"


def check_requests_agree(
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams | Sequence[SamplingParams],
    *,
    max_new_tokens: int,
    eos_token_ids: Collection[int],
    ignore_eos: bool,
) -> None:
    """Under tensor parallelism, raise ``RankDisagreementError`` on every rank unless
    all ranks of the group asked for the same generation."""
    if distributed_state.get_tensor_parallel_world_size() > 1:
        facts = request_facts(
            prompts,
            sampling,
            max_new_tokens=max_new_tokens,
            eos_token_ids=eos_token_ids,
            ignore_eos=ignore_eos,
        )
        check_ranks_agree(get_tp_communicator(), facts)


def request_facts(
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams | Sequence[SamplingParams],
    *,
    max_new_tokens: int,
    eos_token_ids: Collection[int],
    ignore_eos: bool,
) -> list[Fact]:
    """The prompts' ids, the sampling parameters and the stopping rules, as facts."""
    ids = [[int(token) for token in prompt] for prompt in prompts]
    count = sum(map(len, ids))
    prompt_text = f"{len(ids)} prompt{'s' if len(ids) != 1 else ''}, {count} tokens"
    # One SamplingParams for all prompts means one per prompt, as generate reads it.
    params = [sampling] * len(ids) if isinstance(sampling, SamplingParams) else sampling
    described = [_described(p) for p in params]
    sampling_text = (
        described[0] if len(set(described)) == 1 else "per prompt: " + "; ".join(described)
    )
    eos = sorted({int(token) for token in eos_token_ids})
    stopping = {"max_new_tokens": max_new_tokens, "eos_token_ids": eos, "ignore_eos": ignore_eos}
    stopping_text = f"max_new_tokens {max_new_tokens}, {len(eos)} end-of-sequence ids"
    return [
        Fact(
            PROMPTS,
            json.dumps(ids).encode(),
            prompt_text,
            "give every rank the same prompts and the same tokenizer files",
        ),
        Fact(
            SAMPLING,
            json.dumps(described).encode(),
            sampling_text,
            "give every rank the same sampling parameters",
        ),
        Fact(
            STOPPING,
            json.dumps(stopping).encode(),
            stopping_text + (", ignore_eos" if ignore_eos else ""),
            "give every rank the same max_new_tokens, end-of-sequence ids and ignore_eos",
        ),
    ]


def _described(params: SamplingParams) -> str:
    """Every field, in full (repr), so that the text is also the data."""
    return ", ".join(f"{field.name} {getattr(params, field.name)!r}" for field in fields(params))
