"""What each rank of the tensor-parallel loading test runs, under torchrun:

    hf_load_worker.py FOLDER OUT_DIR LEVEL PROMPTS_JSON MAX_NEW_TOKENS

It counts every byte the rank reads from the checkpoint files by wrapping
safetensors' ``safe_open`` where the loader calls it (and refuses ``get_tensor``,
which would read a whole tensor), loads FOLDER at tensor-parallel size 2, generates
greedily and writes ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from slotwise.distributed import init_distributed, shutdown_distributed
from slotwise.models import checkpoint as checkpoint_module
from slotwise.models import load_model
from slotwise.runner.model_runner import ModelRunner

bytes_read = 0


class CountingSlice:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def get_shape(self) -> list[int]:
        return self.inner.get_shape()

    def get_dtype(self) -> str:
        return self.inner.get_dtype()

    def __getitem__(self, index: Any) -> torch.Tensor:
        global bytes_read
        tensor = self.inner[index]
        bytes_read += tensor.numel() * tensor.element_size()
        return tensor


class CountingOpen:
    """``safe_open`` whose slices count the bytes they return."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.inner = safe_open(*args, **kwargs)

    def __enter__(self) -> CountingOpen:
        self.handle = self.inner.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.inner.__exit__(*exc_info)

    def keys(self) -> list[str]:
        return self.handle.keys()

    def get_slice(self, name: str) -> CountingSlice:
        return CountingSlice(self.handle.get_slice(name))

    def get_tensor(self, name: str) -> torch.Tensor:
        raise AssertionError(f"a rank read the whole tensor {name}")


def main() -> None:
    folder, out_dir, level, prompts, max_new_tokens = sys.argv[1:]
    checkpoint_module.safe_open = CountingOpen
    info = init_distributed(tensor_parallel_size=2)
    try:
        model = load_model(folder, compilation_config={"level": int(level), "backend": "eager"})
        tokens = ModelRunner(model, num_blocks=64).generate(
            json.loads(prompts), int(max_new_tokens)
        )
        heads = model.model.layers[0].self_attn.attn.num_heads
    finally:
        shutdown_distributed()
    report = {"tokens": tokens, "bytes_read": bytes_read, "heads_per_rank": heads}
    (Path(out_dir) / f"rank{info.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
