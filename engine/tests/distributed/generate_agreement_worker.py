"""What each rank of the library-level agreement test runs, under a tensor-parallel group
of 2:

    generate_agreement_worker.py OUT_DIR MY_FOLDER SHARED_FOLDER MY_PROMPTS SHARED_PROMPTS

It loads MY_FOLDER (the ranks' differ), then SHARED_FOLDER; generates MY_PROMPTS (the
ranks' differ), then SHARED_PROMPTS, greedily, and writes ``OUT_DIR/rank<r>.json``:
the error each step raised (class and message) or, for the last, the tokens.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import slotwise.distributed as sd
from slotwise_engine.models import load_model
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

LEVEL0 = {"level": 0}


def outcome(step: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"error": None, "result": step()}
    except sd.DistributedError as error:
        return {"error": type(error).__name__, "message": str(error)}


def main() -> None:
    out_dir, my_folder, shared_folder, my_prompts, shared_prompts = sys.argv[1:]
    info = sd.init_distributed(tensor_parallel_size=2)
    try:
        load_mine = outcome(lambda: load_model(my_folder, compilation_config=LEVEL0) and None)
        runner = ModelRunner(load_model(shared_folder, compilation_config=LEVEL0), num_blocks=64)
        generate_mine = outcome(lambda: generate_token_ids(runner, json.loads(my_prompts), 4))
        generate_shared = outcome(lambda: generate_token_ids(runner, json.loads(shared_prompts), 4))
    finally:
        sd.shutdown_distributed()
    report = {"load": load_mine, "generate": generate_mine, "again": generate_shared}
    (Path(out_dir) / f"rank{info.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
