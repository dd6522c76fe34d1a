"""Generating text token by token over a ``ModelRunner``: sampling, stopping, timing.

All prompts run as one batch: one prefill step, then one decode step per token for
the requests still running.  A request stops at an end-of-sequence id (unless
``ignore_eos``) or after ``max_new_tokens``; it leaves the batch at once and its
cache blocks go back to the runner, and every block is returned on any error.

Prompts are checked to be integer token ids before anything runs (a float id is
refused, not truncated), and every step's logits are checked for NaN and +inf
(``Sampler.sample`` says how, at no cost): NaN weights or an activation overflowing
float16 would otherwise give token 0, or another meaningless one, step after step.
"""

from __future__ import annotations

import math
import operator
import os
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from slotwise.errors import SlotwiseError
from slotwise_engine.runner.request_agreement import check_requests_agree
from slotwise_engine.runner.sampling import Sampler, SamplingParams

GREEDY = SamplingParams()


class TokenIdError(SlotwiseError, TypeError):
    """A prompt that is not a sequence of integer token ids."""


class NonFiniteLogitsError(SlotwiseError):
    """A step's logits hold NaN or +inf, or only -inf: no token drawn from them means
    anything."""


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
    prompts: Iterable[Iterable[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingParams | Sequence[SamplingParams] = GREEDY,
    eos_token_ids: Collection[int] = (),
    ignore_eos: bool = False,
    on_step: StepCallback | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
) -> list[Completion]:
    """Continue each prompt (token ids) by at most ``max_new_tokens`` tokens.

    ``prompts``: any sequence of prompts, each any sequence of ints (lists, tuples,
    1-D integer arrays or tensors), or a 2-D integer array or tensor (``token_id_lists``).
    ``sampling``: one ``SamplingParams`` for all prompts or one per prompt.  Under
    tensor parallelism every rank must draw the same tokens: give sampled requests
    a seed.  ``checkpoint``: where the runner's model came from, for errors to name.

    Raises ``NonFiniteLogitsError`` when a step's logits hold NaN or +inf, or only -inf.
    """
    prompts = token_id_lists(prompts)
    check_requests_agree(
        prompts,
        sampling,
        max_new_tokens=max_new_tokens,
        eos_token_ids=eos_token_ids,
        ignore_eos=ignore_eos,
    )
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
                logits = runner.step([requests[i] for i in running])
                tokens, maxima = to_host(*sampler.sample(logits))
                stepped = [completions[i] for i in running]
                if not all(map(math.isfinite, maxima)):
                    raise non_finite_logits_error(runner, checkpoint, stepped, maxima)
                now = time.perf_counter() - start
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


def to_host(tokens: torch.Tensor, maxima: torch.Tensor) -> tuple[list[int], list[float]]:
    """A step's tokens and its rows' largest logits (``Sampler.sample``) on the host,
    for one synchronisation: the maxima's copy is queued without waiting, and reading
    the tokens, queued after it on the same stream, waits for both."""
    maxima = maxima.to("cpu", non_blocking=True)
    return tokens.tolist(), maxima.tolist()


def non_finite_logits_error(
    runner: StepRunner,
    checkpoint: str | os.PathLike[str] | None,
    stepped: list[Completion],
    maxima: list[float],
) -> NonFiniteLogitsError:
    """The error for a step whose rows' largest logits ``maxima`` are not all finite,
    naming the prompts, the model and its dtype and what to try: whether a weight is
    not finite tells a damaged (or, in a narrow dtype, unrepresentable) checkpoint
    from activations that overflow."""
    position = len(stepped[0].token_ids) + 1
    prompt_indices = [c.index for c, m in zip(stepped, maxima, strict=True) if not math.isfinite(m)]
    model = getattr(runner, "model", None)
    weights = dict(model.named_parameters()) if isinstance(model, torch.nn.Module) else {}
    dtype = next((w.dtype for w in weights.values() if w.is_floating_point()), None)
    dtype_name = "" if dtype is None else str(dtype).removeprefix("torch.")
    source = "the model" if checkpoint is None else f"checkpoint {os.fspath(checkpoint)}"
    plural = "s" if len(prompt_indices) > 1 else ""
    where = ", ".join(map(str, prompt_indices))
    what = (
        f"the logits for token {position} of prompt{plural} {where} hold NaN or infinity "
        f"({source}{', ' + dtype_name if dtype_name else ''})"
    )
    other_dtype = (
        'run it in float32 (slotwise generate --dtype float32, load_model(..., dtype="float32")) '
        "or in the dtype it was saved in (config.json's dtype, the default)"
    )
    broken = next((name for name, weight in weights.items() if not _finite(weight)), None)
    if broken is not None and dtype == torch.float32:
        why = (
            f"its weight {broken} holds NaN or infinity: the checkpoint is damaged; "
            "download or export it again"
        )
    elif broken is not None:
        why = (
            f"its weight {broken} holds NaN or infinity in {dtype_name}, from the checkpoint "
            f"or from a value {dtype_name} cannot hold; {other_dtype}, and if that fails, "
            "download or export the checkpoint again"
        )
    elif dtype is not None and dtype != torch.float32:
        largest = torch.finfo(dtype).max
        why = (
            f"its weights are finite, so an activation overflowed {dtype_name} "
            f"(largest value {largest:g}); {other_dtype}"
        )
    elif dtype == torch.float32:
        why = (
            "its weights are finite, so an activation overflowed float32 or a kernel wrote NaN; "
            "run it at -O0 (no compilation) to tell which, or in the dtype it was saved in"
        )
    else:
        why = other_dtype
    return NonFiniteLogitsError(f"{what}: {why}")


def _finite(weight: torch.Tensor) -> bool:
    """Whether every value of ``weight`` is finite; NaN and infinities reach the least
    or the greatest value, so no temporary the size of the weight is made."""
    if not weight.is_floating_point() or weight.numel() == 0:
        return True
    least, greatest = torch.aminmax(weight.detach())
    return bool(least.isfinite() and greatest.isfinite())


def token_id_lists(prompts: object) -> list[list[int]]:
    """``prompts`` as lists of Python ints, checked as Python checks an index
    (``operator.index``): a float id such as 1.7 is refused, not truncated.  Bools are
    refused too: ``True`` as a token id is a mistake, not token 1.

    ``prompts`` is any iterable of prompts or a 2-D array or tensor; each prompt any
    iterable of ints, a 1-D array or tensor included (anything with ``tolist()`` is
    read through it).
    """
    rows = _items(prompts, "prompts", "a list of prompts, each a list of token ids")
    lists = []
    for index, prompt in enumerate(rows):
        hint = f"a list of prompts, e.g. [[{prompt!r}, ...]] for one prompt"
        ids = _items(prompt, f"prompt {index}", hint)
        if not all(type(token) is int for token in ids):
            ids = [_token_id(token, index, position) for position, token in enumerate(ids)]
        lists.append(ids)
    return lists


def _items(value: object, what: str, expected: str) -> list[Any]:
    if isinstance(value, str | bytes):
        raise TokenIdError(
            f"{what} is text ({value[:20]!r}); encode it into token ids first "
            "(slotwise_engine.models.tokenizer.Tokenizer.encode)"
        )
    tolist = getattr(value, "tolist", None)
    items = tolist() if callable(tolist) else value
    if isinstance(items, Iterable):
        return list(items)
    raise TokenIdError(f"{what} is {value!r}, not a sequence; pass {expected}")


def _token_id(token: object, index: int, position: int) -> int:
    if not isinstance(token, bool):
        try:
            return operator.index(token)
        except TypeError:
            pass
    raise TokenIdError(
        f"prompt {index} has {token!r} at position {position}, a {type(token).__name__}; "
        "token ids are ints: convert them exactly (a float id is refused, not truncated)"
    )


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
