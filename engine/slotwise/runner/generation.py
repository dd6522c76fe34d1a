"""Generating text token by token over a ``ModelRunner``: sampling, stopping, timing.

All prompts run as one batch: one prefill step, then one decode step per token for
the requests still running.  A request stops at an end-of-sequence id (unless
``ignore_eos``) or after ``max_new_tokens``; it leaves the batch at once and its
cache blocks go back to the runner, and every block is returned on any error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from slotwise.runner.sampling import Sampler, SamplingParams

GREEDY = SamplingParams()


class StepRunner(Protocol):
    """What generation needs of a runner (``ModelRunner`` is one): requests that hold
    their ``tokens``, a step giving each request's next-token logits, freeing them.
    A protocol, so that the runner can offer ``generate`` without a cycle of imports."""

    device: torch.device

    def add_requests(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[Any]: ...

    def step(self, sequences: Sequence[Any]) -> torch.Tensor: ...

    def free(self, sequences: Sequence[Any]) -> None: ...


@dataclass
class Completion:
    """One prompt's generated tokens and how long they took."""

    index: int
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    #: None while running; "stop" at an end-of-sequence id, "length" at max_new_tokens.
    finish_reason: str | None = None
    #: Seconds from the call to the first token: the prefill and its sampling.
    ttft_s: float = 0.0
    #: Seconds from the call to the last token.
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float | None:
        """The decode rate: tokens after the first over the time they took (the prefill
        is in ``ttft_s``); None for a single token."""
        decode_seconds = self.seconds - self.ttft_s
        if len(self.token_ids) < 2 or decode_seconds <= 0:
            return None
        return (len(self.token_ids) - 1) / decode_seconds


#: Called after every step with the completions that got a token in it (their last
#: id is the new one; ``finish_reason`` is set for those that finished).
StepCallback = Callable[[list[Completion]], None]


def generate(
    runner: StepRunner,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingParams | Sequence[SamplingParams] = GREEDY,
    eos_token_ids: Collection[int] = (),
    ignore_eos: bool = False,
    on_step: StepCallback | None = None,
) -> list[Completion]:
    """Continue each prompt (token ids) by at most ``max_new_tokens`` tokens.

    ``sampling``: one ``SamplingParams`` for all prompts or one per prompt.  Under
    tensor parallelism every rank must draw the same tokens: give sampled requests
    a seed.
    """
    params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else sampling
    if len(params) != len(prompts):
        raise ValueError(f"{len(params)} sampling parameters for {len(prompts)} prompts")
    stop_ids = frozenset() if ignore_eos else frozenset(eos_token_ids)
    completions = [Completion(i, list(prompt)) for i, prompt in enumerate(prompts)]
    start = time.perf_counter()
    requests = runner.add_requests(prompts, max_new_tokens)
    running = list(range(len(prompts)))  # indices of the unfinished requests, in batch order
    try:
        sampler = Sampler(params, runner.device)
        with torch.inference_mode():
            while running:
                tokens = sampler(runner.step([requests[i] for i in running])).tolist()
                now = time.perf_counter() - start
                stepped = [completions[i] for i in running]
                for completion, token in zip(stepped, tokens, strict=True):
                    _append(completion, token, now, stop_ids, max_new_tokens)
                    requests[completion.index].tokens.append(token)
                keep = [row for row, c in enumerate(stepped) if c.finish_reason is None]
                if len(keep) < len(running):
                    finished = [i for i in running if completions[i].finish_reason]
                    running = [running[row] for row in keep]
                    runner.free([requests[i] for i in finished])
                    sampler.keep(keep)
                if on_step is not None:
                    on_step(stepped)
    finally:
        runner.free([requests[i] for i in running])
    return completions


def _append(
    completion: Completion, token: int, now: float, stop_ids: frozenset[int], limit: int
) -> None:
    if not completion.token_ids:
        completion.ttft_s = now
    completion.token_ids.append(token)
    completion.seconds = now
    if token in stop_ids:
        completion.finish_reason = "stop"
    elif len(completion.token_ids) == limit:
        completion.finish_reason = "length"
