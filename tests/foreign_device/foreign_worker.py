"""What the engine tests run on the foreign device, each in a process of its own.

``python foreign_worker.py runner``: the tiny Llama on the device through ``ModelRunner``
with simulated graphs (the plugin's ``RecordedGraphAPI``), and the same model at level 0.
``python foreign_worker.py default-device``: where ``build_llama`` puts a model when no
device is named.  ``torchrun ... foreign_worker.py tp CHECKPOINT FLAGS...``: one rank of
tensor-parallel generation from a checkpoint.  Each prints one JSON object.
"""

from __future__ import annotations

import json
import sys

import torch

from slotwise import current_platform
from slotwise.compilation import CompilationConfig
from slotwise.compilation.static_graphs.contract import reset_capture_window
from slotwise.distributed import init_distributed, shutdown_distributed
from slotwise_engine.models.llama import build_llama
from slotwise_engine.models.loader import load_model
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

PROMPTS = [[1, 5, 9, 3], [7, 7, 2], [42, 11, 100]]
NEW_TOKENS = 5


def runner() -> dict[str, object]:
    graphs = current_platform.get_graph_api()
    config = CompilationConfig(level=3, backend="eager", capture_sizes=[1, 2, 4, 8])
    model = build_llama("tiny", seed=0, compilation_config=config, device="foreign")
    with_graphs = ModelRunner(model, num_blocks=32)
    with_graphs.capture(progress=False)
    try:
        tokens = generate_token_ids(with_graphs, PROMPTS, NEW_TOKENS)
    finally:
        reset_capture_window()
    eager = build_llama(
        "tiny", seed=0, compilation_config=CompilationConfig(level=0), device="foreign"
    )
    return {
        "prompts": PROMPTS,
        "tokens": tokens,
        "eager_tokens": generate_token_ids(ModelRunner(eager, num_blocks=32), PROMPTS, NEW_TOKENS),
        "weights_device": str(next(model.parameters()).device),
        "kv_cache_device": str(with_graphs.device),
        "captures": len(graphs.captures),
        "replays": graphs.replays,
    }


def default_device() -> dict[str, object]:
    model = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    return {"weights_device": str(next(model.parameters()).device)}


def tensor_parallel(checkpoint: str, flags: list[str]) -> dict[str, object]:
    info = init_distributed(2)
    try:
        config = CompilationConfig.from_env_and_cli(flags)
        model = load_model(checkpoint, compilation_config=config)
        runner = ModelRunner(model)
        runner.capture(progress=False)
        tokens = generate_token_ids(runner, PROMPTS, NEW_TOKENS)
        devices = torch.foreign.device_count()
        return {
            "prompts": PROMPTS,
            "rank": info.rank,
            "tokens": tokens,
            "weights_device": str(next(model.parameters()).device),
            "memory_by_device": [torch.foreign.memory_allocated(i) for i in range(devices)],
        }
    finally:
        shutdown_distributed()


def main() -> None:
    command, *rest = sys.argv[1:]
    if command == "runner":
        result = runner()
    elif command == "default-device":
        result = default_device()
    else:
        checkpoint, *flags = rest
        result = tensor_parallel(checkpoint, flags)
    # One write: both ranks share torchrun's stdout, and print() writes the newline apart
    # (two writes, which interleave with the other rank's when stdout is unbuffered).
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
