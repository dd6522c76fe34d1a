"""Greedy generation with tensor parallelism, checked against a single-process run.

    torchrun --nproc-per-node 2 examples/tensor_parallel.py --tp 2
    torchrun --nproc-per-node 2 examples/tensor_parallel.py --tp 2 -O.backend=eager --json
    # several machines: torchrun's usual --nnodes/--node-rank/--rdzv-endpoint flags

Every rank holds a share of each layer's heads and MLP columns; the model is built
from one seed, so all tensor-parallel sizes hold the same weights.  Rank 0 then runs
this script again as a single process and compares the tokens.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys

from slotwise.compilation import CompilationConfig
from slotwise.distributed import init_distributed, shutdown_distributed
from slotwise_engine.models.llama import PRESETS, build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

PROMPTS = [[1, 5, 9, 3], [7, 7, 2], [42, 11, 100, 3, 4, 5]]
#: What torchrun tells its workers; the single-process reference must not see it.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def generate(preset: str, flags: list[str], max_new_tokens: int) -> tuple[list[list[int]], int]:
    """The tokens, and how many attention heads each rank holds."""
    config = CompilationConfig.from_env_and_cli(flags)
    model = build_llama(preset, seed=0, compilation_config=config)
    runner = ModelRunner(model, num_blocks=64)
    runner.capture(progress=False)
    heads = model.model.layers[0].self_attn.attn.num_heads
    return generate_token_ids(runner, PROMPTS, max_new_tokens), heads


def single_process_tokens(args: argparse.Namespace) -> list[list[int]]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    command = [sys.executable, __file__, "--tp", "1", "--preset", args.preset, "--json"]
    command += ["--max-new-tokens", str(args.max_new_tokens), "--no-check"]
    command += [f"-O{flag}" for flag in args.compilation_config or []]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)["tokens"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--max-new-tokens", type=int, default=6)
    parser.add_argument("--no-check", action="store_true", help="skip the single-process run")
    parser.add_argument("--json", action="store_true")
    CompilationConfig.add_cli_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    info = init_distributed(tensor_parallel_size=args.tp)
    try:
        tokens, heads = generate(args.preset, args.compilation_config or [], args.max_new_tokens)
    finally:
        shutdown_distributed()
    if info.rank != 0:
        return 0
    result: dict[str, object] = {"tp": args.tp, "heads_per_rank": heads, "tokens": tokens}
    if not args.no_check:
        result["matches_single_process"] = single_process_tokens(args) == tokens
    if args.json:
        print(json.dumps(result))
    else:
        for prompt, continuation in zip(PROMPTS, tokens, strict=True):
            print(f"{prompt} -> {continuation}")
        if "matches_single_process" in result:
            print(f"matches the single-process run: {result['matches_single_process']}")
    return 0 if result.get("matches_single_process", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
