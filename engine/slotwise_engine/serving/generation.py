"""``generate``: a batch of prompts through the ``LLMEngine``, to the end of each.

The prompts are added to an engine over the runner at once and stepped until all
finish: a request stops at an end-of-sequence id (unless ``ignore_eos``) or after
``max_new_tokens``, and its cache blocks go back at once; every block is returned on
any error.  The engine's budget holds every prompt's prefill and every decode, so
short prompts are prefilled in one step and decode together, as a static batch would;
a prompt longer than the budget is prefilled in chunks.

Prompts are checked to be integer token ids before anything runs (a float id is
refused, not truncated), and every step's logits are checked for NaN and +inf
(``slotwise_engine.serving.non_finite_logits``).
"""

from __future__ import annotations

import operator
import os
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slotwise.errors import SlotwiseError
from slotwise_engine.runner.model_runner import ModelRunner, check_prompts
from slotwise_engine.runner.request_agreement import check_requests_agree
from slotwise_engine.runner.sampling import SamplingParams
from slotwise_engine.serving.engine import LLMEngine
from slotwise_engine.serving.non_finite_logits import NonFiniteLogitsError
from slotwise_engine.serving.request_params import RequestParams

__all__ = [
    "Completion",
    "NonFiniteLogitsError",
    "TokenIdError",
    "generate",
    "generate_token_ids",
    "token_id_lists",
]

GREEDY = SamplingParams()
#: The least step budget of ``generate``'s engine, in tokens.
MIN_BATCHED_TOKENS = 512


class TokenIdError(SlotwiseError, TypeError):
    """A prompt that is not a sequence of integer token ids."""


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
    runner: ModelRunner,
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
    check_requests_agree(  # first: every rank raises the errors below, or none
        prompts,
        sampling,
        max_new_tokens=max_new_tokens,
        eos_token_ids=eos_token_ids,
        ignore_eos=ignore_eos,
    )
    check_prompts(
        prompts, max_new_tokens, vocab_size=runner.vocab_size, max_model_len=runner.max_model_len
    )
    params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else sampling
    if len(params) != len(prompts):
        raise ValueError(f"{len(params)} sampling parameters for {len(prompts)} prompts")
    engine = LLMEngine(
        runner,
        eos_token_ids=eos_token_ids,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=max(MIN_BATCHED_TOKENS, sum(map(len, prompts))),
        checkpoint=checkpoint,
    )
    completions = [Completion(i, list(prompt)) for i, prompt in enumerate(prompts)]
    start = time.monotonic()
    try:
        for index, (prompt, sampled) in enumerate(zip(prompts, params, strict=True)):
            request = RequestParams(
                max_tokens=max_new_tokens,
                temperature=sampled.temperature,
                top_p=sampled.top_p,
                top_k=sampled.top_k,
                seed=sampled.seed,
                ignore_eos=ignore_eos,
            )
            engine.add_request(str(index), prompt, request)
        while engine.has_unfinished():
            try:
                outputs = engine.step()
            except NonFiniteLogitsError as err:
                raise err.naming("prompt", err.subject.names) from None
            stepped = []
            for output in outputs:
                completion = completions[int(output.request_id)]
                completion.token_ids.extend(output.new_token_ids)
                completion.finish_reason = output.finish_reason
                assert output.first_token_time is not None
                completion.ttft_s = output.first_token_time - start
                completion.seconds = (output.finished_time or time.monotonic()) - start
                stepped.append(completion)
            if on_step is not None and stepped:
                on_step(stepped)
    finally:
        for index in range(len(prompts)):
            engine.abort(str(index))
    return completions


def generate_token_ids(
    runner: ModelRunner, prompts: Iterable[Iterable[int]], max_new_tokens: int
) -> list[list[int]]:
    """Greedy continuation of each prompt by ``max_new_tokens`` (at least 1) tokens,
    end-of-sequence ids included: ``generate``'s tokens alone, for when nothing else of
    the completions matters."""
    return [c.token_ids for c in generate(runner, prompts, max_new_tokens=max_new_tokens)]


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
