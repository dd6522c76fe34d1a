"""``slotwise generate``: text from a Hugging Face checkpoint folder, streamed as it comes.

The prompts run together on the engine (``slotwise_engine.serving``, through
``generate``).  One prompt streams its text to stdout as the tokens come.  Several
prompts each print their text whole under a ``[prompt N]`` line when they finish (N
counts the --prompt arguments from 0, as errors and the JSON ``index`` do): streamed
side by side, their pieces would interleave.  ``--json`` prints one object per prompt
and line, in prompt order, at the end.  stdout carries only text or JSON; timings
(time to first token, tokens per second) and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotwise.cli.arguments import (
    MAX_TOKENS,
    add_tp_argument,
    float_in,
    int_in,
    utf8_text,
)
from slotwise.errors import SlotwiseError
from slotwise_engine.serving.request_params import MAX_SEED

if TYPE_CHECKING:
    from slotwise.compilation.config import CompilationConfig
    from slotwise_engine.models.tokenizer import Tokenizer
    from slotwise_engine.runner.sampling import SamplingParams
    from slotwise_engine.serving.generation import Completion

DTYPES = ("float32", "bfloat16", "float16")
#: Temperatures between 0 and this would divide the logits to infinities or 0/0 (a
#: float32 of 1e-46 is 0): greedy decoding is what they mean, and 0 asks for it.
MIN_TEMPERATURE = 1e-5
#: Bound of sane temperatures: at 1e5 sampling is near uniform for any logits a model gives.
MAX_TEMPERATURE = 1e5


class GenerateArgumentError(SlotwiseError):
    """An argument found wrong only once read against the checkpoint; main() reports it
    like argparse does (exit 2)."""


def add_parser(commands: Any, name: str) -> None:
    from slotwise.compilation.config import CompilationConfig

    parser = commands.add_parser(name, help="generate text from a Hugging Face checkpoint")
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="checkpoint folder: config.json, *.safetensors, tokenizer.json",
    )
    parser.add_argument(
        "--prompt",
        required=True,
        action="append",
        type=utf8_text,
        metavar="TEXT",
        help="prompt text (UTF-8); repeat for several prompts, which run together",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int_in(1, MAX_TOKENS),
        default=64,
        help="tokens to generate per prompt at most (>= 1, default 64; the prompt and these "
        "must fit the model's context)",
    )
    parser.add_argument(
        "--temperature",
        type=float_in(MIN_TEMPERATURE, MAX_TEMPERATURE, zero=True),
        default=0.0,
        help=f"sampling temperature: 0 (the default) is greedy, else from {MIN_TEMPERATURE:g} "
        f"to {MAX_TEMPERATURE:g}",
    )
    parser.add_argument(
        "--top-p",
        type=float_in(0, 1, low_open=True),
        default=1.0,
        help="nucleus sampling: keep the most likely tokens up to this mass (0 < p <= 1)",
    )
    parser.add_argument(
        "--top-k",
        type=int_in(0, MAX_TOKENS),
        default=0,
        help="keep the k most likely tokens (>= 0; default 0: all)",
    )
    parser.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        default=None,
        help="seed of the sampling (0 to 2**64 - 1, what torch.Generator takes)",
    )
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="do not stop at end-of-sequence tokens: always generate --max-new-tokens",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="wrap each prompt as a user message in the checkpoint's chat template",
    )
    add_tp_argument(parser, "generate")
    parser.add_argument(
        "--dtype", choices=DTYPES, default=None, help="weights' dtype (default: config.json's)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per prompt and line"
    )
    CompilationConfig.add_cli_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from slotwise.compilation.config import CompilationConfig
    from slotwise_engine.runner.sampling import SamplingParams

    config = CompilationConfig.from_cli_namespace(args)
    sampling = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
    )
    if args.tp > 1 and not sampling.greedy and args.seed is None:
        raise GenerateArgumentError(
            "argument --seed: sampling under --tp needs a seed, so that every rank draws "
            "the same tokens"
        )
    folder = Path(args.model)
    if not folder.is_dir():
        raise GenerateArgumentError(f"argument --model: {folder}: no such folder")

    from slotwise_engine.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(folder)  # before the model: a tokenizer error costs nothing
    prompts = [encode(tokenizer, text, chat=args.chat) for text in args.prompt]
    rank = 0
    if args.tp > 1:
        from slotwise.distributed import init_distributed

        rank = init_distributed(tensor_parallel_size=args.tp).rank
    try:
        if args.tp > 1:
            check_tensor_parallel_ranks(args, sampling, tokenizer, prompts)
        completions = _generate(args, config, sampling, tokenizer, prompts, show=rank == 0)
    finally:
        if args.tp > 1:
            from slotwise.distributed import shutdown_distributed

            shutdown_distributed()
    if rank == 0:
        if args.json:
            for text, completion in zip(args.prompt, completions, strict=True):
                print(json.dumps(as_json(text, completion, tokenizer), ensure_ascii=False))
        print(summary(completions), file=sys.stderr)
    return 0


def check_tensor_parallel_ranks(
    args: argparse.Namespace,
    sampling: SamplingParams,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
) -> None:
    """Stop every rank with one error, before anything is loaded, unless all ranks of
    the tensor-parallel group hold the same checkpoint, versions and request: one
    collective that names everything that differs (load_model and generate check their
    part again, for library callers)."""
    from slotwise.distributed import check_ranks_agree, get_tp_communicator
    from slotwise_engine.models.checkpoint_agreement import checkpoint_facts
    from slotwise_engine.runner.request_agreement import request_facts

    request = request_facts(
        prompts,
        sampling,
        max_new_tokens=args.max_new_tokens,
        eos_token_ids=tokenizer.eos_token_ids,
        ignore_eos=args.ignore_eos,
    )
    check_ranks_agree(get_tp_communicator(), [*checkpoint_facts(Path(args.model)), *request])


def encode(tokenizer: Tokenizer, text: str, *, chat: bool) -> list[int]:
    """The prompt's ids; a chat prompt is rendered by the template, which writes the
    special tokens itself."""
    if chat:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        return tokenizer.encode(rendered, add_special_tokens=False)
    return tokenizer.encode(text)


def _generate(
    args: argparse.Namespace,
    config: CompilationConfig,
    sampling: SamplingParams,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    *,
    show: bool,
) -> list[Completion]:
    from slotwise_engine.models import load_model
    from slotwise_engine.runner.model_runner import ModelRunner, check_prompts
    from slotwise_engine.serving.generation import generate

    model = load_model(args.model, dtype=args.dtype, compilation_config=config)
    try:  # before compiling or capturing anything
        check_prompts(
            prompts,
            args.max_new_tokens,
            vocab_size=model.config.vocab_size,
            max_model_len=model.config.max_position,
        )
    except ValueError as exc:
        raise GenerateArgumentError(f"argument --prompt: {exc}") from exc
    block = model.config.block_size
    # The blocks all prompts need at their longest (the engine takes them as they grow),
    # and one a FULL graph may reserve.
    num_blocks = sum(-(-(len(p) + args.max_new_tokens) // block) for p in prompts) + 1
    runner = ModelRunner(model, num_blocks=num_blocks)
    runner.capture(progress=show and not args.json)
    printer = Printer(tokenizer, stream=len(prompts) == 1)
    return generate(
        runner,
        prompts,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        eos_token_ids=tokenizer.eos_token_ids or model.config.eos_token_ids,
        ignore_eos=args.ignore_eos,
        on_step=printer if show and not args.json else None,
        checkpoint=args.model,
    )


class Printer:
    """Writes text to stdout as ``generate`` reports each step: one prompt's pieces as
    they come, or each of several prompts whole when it finishes."""

    def __init__(self, tokenizer: Tokenizer, *, stream: bool) -> None:
        self.tokenizer = tokenizer
        self.decoder = tokenizer.stream() if stream else None

    def __call__(self, stepped: list[Completion]) -> None:
        for completion in stepped:
            if self.decoder is not None:
                piece = self.decoder.push(completion.token_ids[-1])
                if completion.finish_reason:
                    piece += self.decoder.flush() + "\n"
                sys.stdout.write(piece)
            elif completion.finish_reason:
                text = self.tokenizer.decode(completion.token_ids)
                sys.stdout.write(f"[prompt {completion.index}]\n{text}\n")
        sys.stdout.flush()


def as_json(prompt: str, completion: Completion, tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "index": completion.index,
        "prompt": prompt,
        "prompt_token_ids": completion.prompt_token_ids,
        "token_ids": completion.token_ids,
        "text": tokenizer.decode(completion.token_ids),
        "finish_reason": completion.finish_reason,
        "ttft_s": round(completion.ttft_s, 6),
        "tokens_per_second": completion.tokens_per_second,
    }


def summary(completions: list[Completion]) -> str:
    """One line of timings: the decode rate of one prompt, or of the whole batch (the
    tokens after each first one over the time from the first token to the last)."""
    tokens = sum(len(c.token_ids) for c in completions)
    ttft = min(c.ttft_s for c in completions)
    decoded = tokens - len(completions)
    decode_seconds = max(c.seconds for c in completions) - ttft
    rate = f"{decoded / decode_seconds:.1f} tokens/s" if decoded and decode_seconds > 0 else "-"
    what = (
        f"{tokens} tokens"
        if len(completions) == 1
        else f"{len(completions)} prompts, {tokens} tokens"
    )
    return f"slotwise generate: {what}; time to first token {ttft:.3f} s; {rate}"
