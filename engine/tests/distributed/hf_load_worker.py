"""What each rank of the tensor-parallel loading test runs, under torchrun:

    hf_load_worker.py FOLDER OUT_DIR LEVEL PROMPTS_JSON MAX_NEW_TOKENS

It counts every byte of the checkpoint slices the rank reads by wrapping the
checkpoint's tensors where the loader reads them, loads FOLDER at tensor-parallel
size 2, generates greedily and writes ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from slotwise.distributed import init_distributed, shutdown_distributed
from slotwise_engine.models import checkpoint as checkpoint_module
from slotwise_engine.models import load_model
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

bytes_read = 0
CHECKPOINT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class CountingTensor(checkpoint_module.CheckpointTensor):
    """A checkpoint tensor that counts the bytes of the slices read from it, indexed or
    copied into a parameter."""

    def __getitem__(self, index: Any) -> torch.Tensor:
        global bytes_read
        tensor = super().__getitem__(index)
        bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def copy_to(self, dest: torch.Tensor, index: Any = None) -> None:
        global bytes_read
        super().copy_to(dest, index)
        bytes_read += dest.numel() * CHECKPOINT_DTYPES[self.dtype].itemsize


def main() -> None:
    folder, out_dir, level, prompts, max_new_tokens = sys.argv[1:]
    checkpoint_module.CheckpointTensor = CountingTensor
    info = init_distributed(tensor_parallel_size=2)
    try:
        model = load_model(folder, compilation_config={"level": int(level), "backend": "eager"})
        tokens = generate_token_ids(
            ModelRunner(model, num_blocks=64), json.loads(prompts), int(max_new_tokens)
        )
        heads = model.model.layers[0].self_attn.attn.num_heads
    finally:
        shutdown_distributed()
    report = {"tokens": tokens, "bytes_read": bytes_read, "heads_per_rank": heads}
    (Path(out_dir) / f"rank{info.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
