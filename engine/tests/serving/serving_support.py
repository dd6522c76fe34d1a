"""What the serving tests share: a tiny random model, a byte-level tokenizer over its
256 ids, engines over them, and logits that force chosen tokens."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from slotwise.compilation import CompilationConfig
from slotwise_engine.models.llama import build_llama
from slotwise_engine.models.tokenizer import Tokenizer
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.engine import LLMEngine
from slotwise_engine.serving.outputs import RequestOutput
from slotwise_engine.serving.request_params import RequestParams
from slotwise_engine.serving.scheduler import ScheduledStep

_MODEL = None


def tiny_runner(num_blocks: int = 32) -> ModelRunner:
    """A runner over the tiny Llama (vocabulary 256, blocks of 16 tokens), eager."""
    global _MODEL
    if _MODEL is None:
        _MODEL = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    return ModelRunner(_MODEL, num_blocks=num_blocks)


def byte_tokenizer() -> Tokenizer:
    """A byte-level BPE without merges: token i is one byte, so every character beyond
    ASCII spans several tokens, and any of the tiny model's ids decodes."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    backend = Backend(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend)


def run_alone(prompt: Sequence[int], params: RequestParams, **engine_args: object) -> list[int]:
    """The tokens ``prompt`` gets alone in a fresh engine."""
    engine = LLMEngine(tiny_runner(), **engine_args)  # type: ignore[arg-type]
    engine.add_request("alone", prompt, params)
    return finished(drain(engine))["alone"].token_ids


def drain(engine: LLMEngine, max_steps: int = 1000) -> list[RequestOutput]:
    """Every output until the engine has nothing left."""
    outputs: list[RequestOutput] = []
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return outputs
        outputs += engine.step()
    raise AssertionError(f"the engine did not finish in {max_steps} steps")


def finished(outputs: list[RequestOutput]) -> dict[str, RequestOutput]:
    """The last output of each finished request, by id."""
    return {o.request_id: o for o in outputs if o.finished}


def record_steps(engine: LLMEngine, monkeypatch) -> list[ScheduledStep]:
    """The scheduler's decisions, one per step, as it makes them."""
    steps: list[ScheduledStep] = []
    schedule = engine.scheduler.schedule

    def recorded() -> ScheduledStep:
        step = schedule()
        steps.append(step)
        return step

    monkeypatch.setattr(engine.scheduler, "schedule", recorded)
    return steps


def force_tokens(
    runner: ModelRunner,
    monkeypatch,
    next_token: Callable[[list[int]], int | None],
) -> None:
    """Make each step's argmax ``next_token(tokens so far)`` where it is not None: the
    model still runs every step, its logits are overridden."""
    step = runner.step

    def forced(sequences: Sequence) -> torch.Tensor:
        logits = step(sequences)
        for row, sequence in enumerate(sequences):
            token = next_token(list(sequence.tokens))
            if token is not None:
                logits[row] = -10.0
                logits[row, token] = 10.0
        return logits

    monkeypatch.setattr(runner, "step", forced)


def scripted(
    prompt: Sequence[int], continuation: Sequence[int]
) -> Callable[[list[int]], int | None]:
    """``next_token`` for ``force_tokens``: after ``prompt``, ``continuation`` in turn."""
    prompt = list(prompt)

    def next_token(tokens: list[int]) -> int | None:
        if tokens[: len(prompt)] != prompt or len(tokens) < len(prompt):
            return None
        index = len(tokens) - len(prompt)
        return continuation[index] if index < len(continuation) else None

    return next_token
