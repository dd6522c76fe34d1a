"""Greedy generation from prompts of token ids with a compiled Llama-architecture model.

    python examples/generate.py --prompt 1,5,9,3 --prompt 7,7,2 --max-new-tokens 8
    python examples/generate.py --preset tiny -O.backend=eager --check --json

The weights are seeded random numbers, so the tokens mean nothing; ``--check``
generates again with the uncompiled model and fails if any token differs.  The
compilation config is SLOTWISE_COMPILATION_CONFIG with the ``-O`` flags laid over it.
"""

from __future__ import annotations

import argparse
import json
import logging

from slotwise.cli.arguments import MAX_TOKENS, int_in
from slotwise.compilation import CompilationConfig
from slotwise_engine.models.llama import PRESETS, build_llama
from slotwise_engine.runner.model_runner import ModelRunner, check_prompts
from slotwise_engine.serving.generation import generate_token_ids


def parse_prompt(text: str) -> list[int]:
    try:
        return [int(token) for token in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"prompt {text!r} must be comma-separated token ids"
        ) from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument(
        "--prompt", type=parse_prompt, action="append", help="token ids, e.g. 1,5,9"
    )
    parser.add_argument("--max-new-tokens", type=int_in(1, MAX_TOKENS), default=8)
    parser.add_argument("--check", action="store_true", help="compare with the uncompiled model")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    CompilationConfig.add_cli_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    prompts = args.prompt or [[1, 5, 9, 3], [7, 7, 2]]
    preset = PRESETS[args.preset]
    # Refuse bad input here, before the model is built, compiled and captured.
    try:
        config = CompilationConfig.from_cli_namespace(args)
        check_prompts(
            prompts,
            args.max_new_tokens,
            vocab_size=preset.vocab_size,
            max_model_len=preset.max_position,
        )
    except ValueError as err:  # a ConfigError is one too
        parser.error(str(err))
    model = build_llama(args.preset, seed=0, compilation_config=config)
    runner = ModelRunner(model, num_blocks=64)
    runner.capture(progress=not args.json)
    tokens = generate_token_ids(runner, prompts, args.max_new_tokens)
    result: dict[str, object] = {"prompts": prompts, "tokens": tokens, "config": config.to_dict()}
    if args.check:
        eager = build_llama(args.preset, seed=0, compilation_config=CompilationConfig(level=0))
        result["matches_eager"] = (
            generate_token_ids(ModelRunner(eager, num_blocks=64), prompts, args.max_new_tokens)
            == tokens
        )
    if args.json:
        print(json.dumps(result))
    else:
        for prompt, continuation in zip(prompts, tokens, strict=True):
            print(f"{prompt} -> {continuation}")
        if args.check:
            print("matches eager" if result["matches_eager"] else "DIFFERS FROM EAGER")
    return 0 if result.get("matches_eager", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
