"""Tensor-parallel layers: at TP=2 each equals its unsharded layer, and a model built
from them gives the same logits at TP=1 and TP=2, eager and compiled in one graph.

The two-process part runs once (module fixture); everything at TP=1 runs here, with
no process group at all, as a single-process model would.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dist_worker import BLOCK_IDS, BLOCK_SEED, LAYER_CHECKS, WORLD, TinyBlock
from support import free_port, run_together, torchrun_env
from torch import nn

import slotwise.distributed as sd
from slotwise.distributed import parallel_layers

WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("layers")
    port = free_port()
    commands = [
        ([sys.executable, str(WORKER), "layers", str(out)], torchrun_env(rank, WORLD, port))
        for rank in range(WORLD)
    ]
    for rank, finished in enumerate(run_together(commands, timeout=120)):
        assert finished.returncode == 0, f"rank {rank}:\n{finished.stderr[-6000:]}"
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYER_CHECKS)
def test_each_layer_at_tp2_equals_the_unsharded_layer(ranks, name):
    for rank, results in enumerate(ranks):
        assert set(results["layers"]) == set(LAYER_CHECKS)
        got, expected = results["layers"][name]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=f"rank {rank}")


@pytest.mark.slow
def test_a_model_gives_the_same_logits_at_tp1_and_tp2_eager_and_compiled(ranks):
    single = TinyBlock()  # no init_distributed: TP=1
    single.load_seeded(BLOCK_SEED)
    expected = single(BLOCK_IDS)
    assert single.qkv.weight.shape[0] == 32
    for rank, results in enumerate(ranks):
        assert results["block_qkv_weight_rows"] == 16, "each rank holds half the heads"
        for key in ("block_eager", "block_compiled"):
            torch.testing.assert_close(
                results[key], expected, rtol=1e-5, atol=1e-5, msg=f"rank {rank} {key}"
            )


@pytest.mark.slow
def test_the_collectives_are_ops_in_one_fullgraph_trace(ranks):
    for results in ranks:  # fullgraph=True: a graph break would have failed the run
        targets = results["compiled_targets"]
        assert "slotwise.tp_all_reduce.out" in targets  # the layers' out variant
        assert "slotwise.tp_all_gather.default" in targets


# -- TP=1, in this process -------------------------------------------------------


def linear_pair(layer: nn.Module, bias: bool) -> nn.Linear:
    """An nn.Linear with the full weight, loaded into ``layer`` as well."""
    reference = nn.Linear(layer.input_size, layer.output_size, bias=bias)
    layer.load_full_weight(reference.weight.detach(), reference.bias.detach() if bias else None)
    return reference


@pytest.mark.parametrize("bias", [True, False])
def test_without_init_each_layer_is_its_torch_nn_counterpart(bias):
    assert not sd.is_initialized()
    x = torch.randn(3, 8)
    layers = [
        sd.ColumnParallelLinear(8, 6, bias=bias),
        sd.ColumnParallelLinear(8, 6, bias=bias, gather_output=True),
        sd.MergedColumnParallelLinear(8, [4, 2], bias=bias),
        sd.QKVParallelLinear(8, 2, 2, 1, bias=bias),
        sd.RowParallelLinear(8, 6, bias=bias),
        sd.RowParallelLinear(8, 6, bias=bias, input_is_parallel=False),
    ]
    for layer in layers:
        reference = linear_pair(layer, bias)
        torch.testing.assert_close(layer(x), reference(x), rtol=0, atol=0)


def test_without_init_the_vocabulary_layers_are_embedding_and_linear():
    table, x = torch.randn(10, 8), torch.randn(3, 8)
    ids = torch.tensor([[1, 9], [0, 4]])
    embedding = sd.VocabParallelEmbedding(10, 8)
    embedding.load_full_weight(table)
    assert torch.equal(embedding(ids), F.embedding(ids, table))
    head = sd.ParallelLMHead(10, 8)
    head.load_full_weight(table)
    assert torch.equal(head(x), F.linear(x, table))


# -- which slice each rank keeps, at TP=4, without processes -----------------------


@pytest.fixture
def tp4(monkeypatch: pytest.MonkeyPatch):
    """Build layers as rank ``r`` of a tensor-parallel group of 4 would."""

    def as_rank(rank: int) -> None:
        monkeypatch.setattr(parallel_layers, "get_tensor_parallel_rank", lambda: rank)
        monkeypatch.setattr(parallel_layers, "get_tensor_parallel_world_size", lambda: 4)

    return as_rank


def row_ids(rows: int, columns: int) -> torch.Tensor:
    """A full weight whose every entry is its row number, so a shard shows its rows."""
    return torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, columns).clone()


@pytest.mark.parametrize("rank", range(4))
def test_each_rank_keeps_its_rows_and_heads(tp4, rank):
    tp4(rank)
    column = sd.ColumnParallelLinear(4, 8, bias=False)
    column.load_full_weight(row_ids(8, 4))
    assert column.weight[:, 0].tolist() == [2 * rank, 2 * rank + 1]

    merged = sd.MergedColumnParallelLinear(4, [8, 4], bias=False)
    merged.load_full_weight(row_ids(12, 4))
    assert merged.weight[:, 0].tolist() == [2 * rank, 2 * rank + 1, 8 + rank]

    # 8 query heads, 2 kv heads, head size 2: 2 query heads per rank, each kv head on 2 ranks.
    qkv = sd.QKVParallelLinear(4, 2, 8, 2, bias=False)
    qkv.load_full_weight(row_ids(24, 4))
    kv = 2 * (rank // 2)
    expected = [*range(4 * rank, 4 * rank + 4), 16 + kv, 17 + kv, 20 + kv, 21 + kv]
    assert qkv.weight[:, 0].tolist() == expected
    assert (qkv.num_heads, qkv.num_kv_heads, qkv.q_size, qkv.kv_size) == (2, 1, 4, 2)

    row = sd.RowParallelLinear(8, 3, bias=True)
    row.load_full_weight(row_ids(8, 3).T.contiguous(), torch.arange(3.0))
    assert row.weight[0].tolist() == [2 * rank, 2 * rank + 1]
    assert row.bias.tolist() == [0, 1, 2]

    # 10 tokens over 4 ranks: 3 rows each, the last rank holds token 9 and 2 zero rows.
    embedding = sd.VocabParallelEmbedding(10, 2)
    embedding.load_full_weight(row_ids(10, 2) + 1)
    kept = [token + 1 for token in range(3 * rank, min(3 * rank + 3, 10))]
    assert embedding.weight[:, 0].tolist() == kept + [0] * (3 - len(kept))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: sd.ColumnParallelLinear(4, 6), r"output_size \(6\) is not divisible by .* 4"),
        (lambda: sd.MergedColumnParallelLinear(4, [8, 6]), r"output_sizes\[1\] \(6\)"),
        (lambda: sd.RowParallelLinear(6, 4), r"input_size \(6\) is not divisible"),
        (lambda: sd.QKVParallelLinear(4, 2, 6, 2), r"total_num_heads \(6\)"),
        (lambda: sd.QKVParallelLinear(4, 2, 8, 3), r"total_num_kv_heads \(3\) is smaller"),
        (lambda: sd.QKVParallelLinear(4, 2, 8, 6), r"total_num_kv_heads \(6\) is not divisible"),
    ],
)
def test_sizes_that_do_not_split_evenly_are_refused(tp4, build, message):
    tp4(0)
    with pytest.raises(ValueError, match=message):
        build()


def test_load_full_weight_wants_the_unsharded_tensor(tp4):
    tp4(1)
    column = sd.ColumnParallelLinear(4, 8, bias=False)
    with pytest.raises(ValueError, match=r"unsharded tensor of shape \(8, 4\), got \(2, 4\)"):
        column.load_full_weight(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="bias=False"):
        column.load_full_weight(torch.zeros(8, 4), torch.zeros(8))
