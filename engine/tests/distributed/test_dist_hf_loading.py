"""Loading a sharded checkpoint under tensor parallelism: each rank reads only its slice.

Without processes, rank 0 and rank 1 of a size-2 group are built in turn (the
parallel layers' rank and size patched) and the bytes each reads are counted.
Under torchrun (slow), two real ranks load the checkpoint, count the bytes they
read through wrapped checkpoint tensors, and generate the single process's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from models.hf_checkpoints import make_checkpoint
from safetensors.torch import load_file
from support import torchrun

from slotwise.distributed import parallel_layers
from slotwise.distributed import state as distributed_state
from slotwise_engine.models import load_model
from slotwise_engine.models.checkpoint import Checkpoint
from slotwise_engine.models.hf_config import HFConfig
from slotwise_engine.models.loader import load_weights
from slotwise_engine.models.registry import model_class
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

WORKER = Path(__file__).resolve().parent / "hf_load_worker.py"
PROMPTS = [[12, 5, 9], list(range(100, 124)), [299, 0, 1, 2, 3, 4, 5]]
LEVEL0 = {"level": 0}


def tensor_bytes(folder: Path) -> int:
    return sum(
        t.numel() * t.element_size()
        for shard in folder.glob("*.safetensors")
        for t in load_file(shard).values()
    )


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    folder = make_checkpoint(
        "llama-bias-linear", tmp_path_factory.mktemp("tp"), max_shard_size="100KB"
    )
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 2
    return folder


def load_as_rank(folder: Path, rank: int, monkeypatch: pytest.MonkeyPatch):
    """The model rank ``rank`` of 2 loads, and the checkpoint bytes it read."""
    monkeypatch.setattr(parallel_layers, "get_tensor_parallel_rank", lambda: rank)
    monkeypatch.setattr(parallel_layers, "get_tensor_parallel_world_size", lambda: 2)
    monkeypatch.setattr(distributed_state, "get_tensor_parallel_world_size", lambda: 2)
    hf = HFConfig.read(folder)
    cls = model_class(hf)
    with Checkpoint(folder) as checkpoint:
        model = cls.empty(cls.config_from_hf(hf), compilation_config=LEVEL0)
        load_weights(model, checkpoint)
    return model, checkpoint.bytes_read


def test_each_rank_reads_its_half_and_together_they_hold_the_model(sharded, monkeypatch):
    full = load_model(sharded, compilation_config=LEVEL0)
    ranks = [load_as_rank(sharded, rank, monkeypatch) for rank in (0, 1)]
    total = tensor_bytes(sharded)
    for _, read in ranks:
        assert 0.45 * total < read < 0.55 * total  # norms and row-parallel biases replicate
    assert ranks[0][1] + ranks[1][1] > total

    layer = full.model.layers[1]
    (r0, _), (r1, _) = ranks
    shards = [r.model.layers[1] for r in (r0, r1)]
    q_rows = layer.self_attn.qkv_proj.q_size
    half_q = q_rows // 2
    assert torch.equal(
        torch.cat([s.self_attn.qkv_proj.weight[:half_q] for s in shards]),
        layer.self_attn.qkv_proj.weight[:q_rows],
    )
    assert torch.equal(
        torch.cat([s.self_attn.o_proj.weight for s in shards], dim=1), layer.self_attn.o_proj.weight
    )
    assert torch.equal(shards[0].mlp.down_proj.bias, layer.mlp.down_proj.bias)
    assert torch.equal(
        torch.cat([r.model.embed_tokens.weight for r in (r0, r1)]), full.model.embed_tokens.weight
    )


@pytest.mark.slow
@pytest.mark.parametrize("spec, level", [("llama-bias-linear", 0), ("qwen3", 3)])
def test_torchrun_ranks_read_their_shards_and_generate_the_single_process_tokens(
    spec, level, tmp_path
):
    folder = make_checkpoint(spec, tmp_path / "checkpoint", max_shard_size="100KB")
    expected = generate_token_ids(
        ModelRunner(load_model(folder, compilation_config=LEVEL0), num_blocks=64), PROMPTS, 8
    )
    out = tmp_path / "out"
    out.mkdir()
    result = torchrun(
        str(WORKER), str(folder), str(out), str(level), json.dumps(PROMPTS), "8",
        SLOTWISE_DIST_TIMEOUT="120", SLOTWISE_DISABLE_COMPILE_CACHE="1",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    total = tensor_bytes(folder)
    for rank in (0, 1):
        report = json.loads((out / f"rank{rank}.json").read_text())
        assert report["tokens"] == expected
        assert report["heads_per_rank"] == 2
        assert 0.4 * total < report["bytes_read"] < 0.6 * total
