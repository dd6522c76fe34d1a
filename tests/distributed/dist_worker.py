"""What each rank of a distributed test runs: ``python dist_worker.py SCENARIO OUT_DIR [RANK]``.

A scenario saves what its rank saw to ``OUT_DIR/rank<r>.pt``; the tests compare that
with a single-process oracle.  The inputs, the test cases and the tiny model live
here too, so the tests regenerate exactly what the ranks used.  Expected failures
are caught and saved (error class, message, seconds taken) rather than raised, so a
non-zero exit always means a real crash.
"""

from __future__ import annotations

import os
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import slotwise.distributed as sd

DTYPES = (torch.float32, torch.bfloat16, torch.int64)
SHAPES = ((8,), (4, 6), (2, 3, 8))
WORLD = 2


def make_input(rank: int, dtype: torch.dtype, shape: tuple[int, ...], key: str) -> torch.Tensor:
    """The tensor rank ``rank`` contributes to case ``key``: a fixed function of both."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{key}/{rank}".encode()))
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.randint(-100, 100, shape, generator=generator, dtype=dtype)


@dataclass(frozen=True)
class Case:
    """One collective call: which op, on what, along which dim."""

    op: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    dim: int | None = None

    @property
    def key(self) -> str:
        shape = "x".join(map(str, self.shape))
        dim = "" if self.dim is None else f"-dim{self.dim}"
        return f"{self.op}-{str(self.dtype).removeprefix('torch.')}-{shape}{dim}"

    def input(self, rank: int) -> torch.Tensor:
        return make_input(rank, self.dtype, self.shape, self.key)


def collective_cases() -> list[Case]:
    cases = []
    for dtype in DTYPES:
        for shape in SHAPES:
            cases += [Case("all_reduce", dtype, shape), Case("broadcast", dtype, shape)]
            cases.append(Case("send_recv", dtype, shape))
            for dim in (0, -1):
                for op in ("all_gather", "reduce_scatter", "gather"):
                    cases.append(Case(op, dtype, shape, dim))
    # The custom ops dispatch to the same communicator; float32 is enough to check them.
    for shape in SHAPES:
        cases.append(Case("op_all_reduce", torch.float32, shape))
        cases.append(Case("op_all_reduce_out", torch.float32, shape))
        for dim in (0, -1):
            cases.append(Case("op_all_gather", torch.float32, shape, dim))
            cases.append(Case("op_reduce_scatter", torch.float32, shape, dim))
    return cases


def run_case(comm: sd.Communicator, case: Case) -> torch.Tensor | None:
    x = case.input(comm.rank)
    if case.op == "all_reduce":
        return comm.all_reduce(x)
    if case.op == "all_gather":
        return comm.all_gather(x, dim=case.dim)
    if case.op == "reduce_scatter":
        return comm.reduce_scatter(x, dim=case.dim)
    if case.op == "gather":
        return comm.gather(x, dst=1, dim=case.dim)
    if case.op == "broadcast":
        return comm.broadcast(x, src=1)
    if case.op == "send_recv":  # rank 0 sends first, rank 1 answers
        if comm.rank == 0:
            comm.send(x, dst=1)
            return comm.recv(x.shape, x.dtype, src=1)
        received = comm.recv(x.shape, x.dtype, src=0)
        comm.send(x, dst=0)
        return received
    if case.op == "op_all_reduce":
        return torch.ops.slotwise.tp_all_reduce(x, sd.TP_GROUP)
    if case.op == "op_all_reduce_out":
        out = torch.empty_like(x)
        torch.ops.slotwise.tp_all_reduce.out(x, sd.TP_GROUP, out=out)
        return out
    if case.op == "op_all_gather":
        return torch.ops.slotwise.tp_all_gather(x, case.dim, sd.TP_GROUP)
    if case.op == "op_reduce_scatter":
        return torch.ops.slotwise.tp_reduce_scatter(x, case.dim, sd.TP_GROUP)
    raise ValueError(f"unknown op {case.op}")


# -- a tiny transformer block built from every parallel layer --------------------

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_SIZE, INTERMEDIATE = 11, 16, 4, 2, 4, 24


class TinyBlock(nn.Module):
    """Embedding, grouped-query attention, SwiGLU MLP and LM head, tensor parallel.

    Heads are split across ranks by ``QKVParallelLinear``; attention itself is plain
    causal SDPA over the rank's heads.
    """

    def __init__(self) -> None:
        super().__init__()
        self.embed = sd.VocabParallelEmbedding(VOCAB, HIDDEN)
        self.qkv = sd.QKVParallelLinear(HIDDEN, HEAD_SIZE, HEADS, KV_HEADS, bias=True)
        self.o_proj = sd.RowParallelLinear(HEADS * HEAD_SIZE, HIDDEN, bias=False)
        self.gate_up = sd.MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE] * 2, bias=False)
        self.down = sd.RowParallelLinear(INTERMEDIATE, HIDDEN, bias=True)
        self.lm_head = sd.ParallelLMHead(VOCAB, HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        q, k, v = self.qkv(hidden).split([self.qkv.q_size, self.qkv.kv_size, self.qkv.kv_size], -1)
        heads, kv_heads = self.qkv.num_heads, self.qkv.num_kv_heads
        q = q.view(-1, heads, HEAD_SIZE).transpose(0, 1)
        k = k.view(-1, kv_heads, HEAD_SIZE).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        v = v.view(-1, kv_heads, HEAD_SIZE).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        hidden = hidden + self.o_proj(attended.transpose(0, 1).reshape(-1, heads * HEAD_SIZE))
        gate, up = self.gate_up(hidden).chunk(2, dim=-1)
        hidden = hidden + self.down(F.silu(gate) * up)
        return self.lm_head(hidden)

    def load_seeded(self, seed: int) -> None:
        """The same full weights at every tensor-parallel size, each rank keeping its part."""
        generator = torch.Generator().manual_seed(seed)

        def draw(*shape: int) -> torch.Tensor:
            return torch.randn(shape, generator=generator) * 0.2

        qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_SIZE
        self.embed.load_full_weight(draw(VOCAB, HIDDEN))
        self.qkv.load_full_weight(draw(qkv_rows, HIDDEN), draw(qkv_rows))
        self.o_proj.load_full_weight(draw(HIDDEN, HEADS * HEAD_SIZE))
        self.gate_up.load_full_weight(draw(2 * INTERMEDIATE, HIDDEN))
        self.down.load_full_weight(draw(HIDDEN, INTERMEDIATE), draw(HIDDEN))
        self.lm_head.load_full_weight(draw(VOCAB, HIDDEN))


BLOCK_SEED = 7
BLOCK_IDS = torch.tensor([0, 3, 5, 10, 7, 1, 9])


# -- one parallel layer at a time, each against its unsharded computation --------

LAYER_CHECKS = (
    "column",
    "column_gather_output",
    "merged_column",
    "qkv_2_kv_heads",
    "qkv_1_kv_heads",
    "row",
    "row_full_input",
    "row_no_bias",
    "embedding_10",
    "lm_head_10",
    "embedding_11",
    "lm_head_11",
)


def layer_checks(rank: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``name -> (what the parallel layer gave, what the unsharded layer gives)``."""
    generator = torch.Generator().manual_seed(11)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    x16, x12, x24 = draw(5, 16), draw(5, 12), draw(3, 24)
    w, b = draw(12, 16), draw(12)
    results = {}

    column = sd.ColumnParallelLinear(16, 12)
    column.load_full_weight(w, b)
    results["column"] = (column(x16), F.linear(x16, w, b)[:, rank * 6 : rank * 6 + 6])
    gathered = sd.ColumnParallelLinear(16, 12, gather_output=True)
    gathered.load_full_weight(w, b)
    results["column_gather_output"] = (gathered(x16), F.linear(x16, w, b))

    gate_up_w = draw(16, 16)
    merged = sd.MergedColumnParallelLinear(16, [8, 8], bias=False)
    merged.load_full_weight(gate_up_w)
    gate, up = F.linear(x16, gate_up_w).split(8, dim=-1)
    shard = slice(rank * 4, rank * 4 + 4)
    results["merged_column"] = (merged(x16), torch.cat([gate[:, shard], up[:, shard]], -1))

    for kv_heads in (2, 1):  # one kv head per rank; one kv head replicated on both
        qkv_w, qkv_b = draw((4 + 2 * kv_heads) * 2, 16), draw((4 + 2 * kv_heads) * 2)
        qkv = sd.QKVParallelLinear(16, 2, 4, kv_heads, bias=True)
        qkv.load_full_weight(qkv_w, qkv_b)
        q, k, v = F.linear(x16, qkv_w, qkv_b).split([8, 2 * kv_heads, 2 * kv_heads], -1)
        kv_head = rank * kv_heads // 2
        expected = torch.cat(
            [
                q[:, rank * 4 : rank * 4 + 4],
                k[:, kv_head * 2 : kv_head * 2 + 2],
                v[:, kv_head * 2 : kv_head * 2 + 2],
            ],
            -1,
        )
        results[f"qkv_{kv_heads}_kv_heads"] = (qkv(x16), expected)

    row_w, row_b = draw(16, 12), draw(16)
    row = sd.RowParallelLinear(12, 16)
    row.load_full_weight(row_w, row_b)
    results["row"] = (row(x12[:, rank * 6 : rank * 6 + 6]), F.linear(x12, row_w, row_b))
    row_full = sd.RowParallelLinear(12, 16, input_is_parallel=False)
    row_full.load_full_weight(row_w, row_b)
    results["row_full_input"] = (row_full(x12), F.linear(x12, row_w, row_b))
    row_24 = sd.RowParallelLinear(24, 16, bias=False)
    row_24.load_full_weight(row_w.repeat(1, 2))
    results["row_no_bias"] = (
        row_24(x24[:, rank * 12 : rank * 12 + 12]),
        F.linear(x24, row_w.repeat(1, 2)),
    )

    for vocab in (10, 11):  # even split; padded last shard
        table = draw(vocab, 16)
        ids = torch.tensor([[0, vocab - 1, 4], [5, 6, 2]])
        embedding = sd.VocabParallelEmbedding(vocab, 16)
        embedding.load_full_weight(table)
        results[f"embedding_{vocab}"] = (embedding(ids), F.embedding(ids, table))
        head = sd.ParallelLMHead(vocab, 16)
        head.load_full_weight(table)
        results[f"lm_head_{vocab}"] = (head(x16), F.linear(x16, table))
    return results


# -- scenarios -------------------------------------------------------------------


def collectives(out: Path) -> dict[str, Any]:
    sd.init_distributed(tensor_parallel_size=WORLD)
    comm = sd.get_tp_communicator()
    results: dict[str, Any] = {case.key: run_case(comm, case) for case in collective_cases()}
    sd.get_world_communicator().barrier()
    results["communicator"] = type(comm).__name__
    results["backend"] = dist.get_backend(comm.group)
    results["rank"] = comm.rank
    sd.shutdown_distributed()
    return results


def layers(out: Path) -> dict[str, Any]:
    info = sd.init_distributed(tensor_parallel_size=WORLD)
    results: dict[str, Any] = {"layers": layer_checks(info.tensor_parallel_rank)}
    block = TinyBlock()
    block.load_seeded(BLOCK_SEED)
    results["block_eager"] = block(BLOCK_IDS)
    results["block_qkv_weight_rows"] = block.qkv.weight.shape[0]
    seen: list[str] = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        seen.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    compiled = torch.compile(block, fullgraph=True, backend=recording_backend)
    results["block_compiled"] = compiled(BLOCK_IDS)
    results["compiled_targets"] = sorted(set(seen))
    sd.shutdown_distributed()
    return results


def _failure(error: BaseException, started: float) -> dict[str, Any]:
    """What a rank saw fail; it then shuts down, as a program handling the error would."""
    seconds = time.monotonic() - started
    sd.shutdown_distributed()
    return {
        "error": type(error).__name__,
        "message": str(error),
        "seconds": seconds,
    }


def peer_exits(out: Path) -> dict[str, Any]:
    """Rank 1 leaves right after start-up, as a crash would; rank 0 then all-reduces."""
    info = sd.init_distributed(tensor_parallel_size=WORLD)
    if info.rank == 1:
        os._exit(0)  # no shutdown, no goodbye
    started = time.monotonic()
    try:
        sd.get_tp_communicator().all_reduce(torch.ones(4))
    except sd.DistributedError as error:
        return _failure(error, started)
    return {"error": None}


def peer_stuck(out: Path) -> dict[str, Any]:
    """Rank 1 stays alive but never joins the all-reduce; it leaves once rank 0 reported."""
    info = sd.init_distributed(tensor_parallel_size=WORLD)
    if info.rank == 1:
        deadline = time.monotonic() + 60
        while not (out / "rank0.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)
    started = time.monotonic()
    try:
        sd.get_tp_communicator().all_reduce(torch.ones(4))
    except sd.DistributedError as error:
        return _failure(error, started)
    return {"error": None}


def init_only(out: Path) -> dict[str, Any]:
    """Join and leave; a bad launch fails here."""
    started = time.monotonic()
    try:
        sd.init_distributed(tensor_parallel_size=1)
    except sd.DistributedError as error:
        return _failure(error, started)
    sd.shutdown_distributed()
    return {"error": None}


def explicit(out: Path, rank: int) -> dict[str, Any]:
    """No torchrun: rank, world size and a file:// rendezvous as arguments, twice."""
    info = sd.init_distributed(
        tensor_parallel_size=2, rank=rank, world_size=WORLD, init_method=f"file://{out}/first"
    )
    first = sd.get_tp_communicator().all_reduce(torch.full((3,), float(rank + 1)))
    sd.shutdown_distributed()
    initialised_after_shutdown = dist.is_initialized()
    # Again, with one rank per tensor-parallel group this time.
    second = sd.init_distributed(
        tensor_parallel_size=1, rank=rank, world_size=WORLD, init_method=f"file://{out}/second"
    )
    tp_sum = sd.get_tp_communicator().all_reduce(torch.full((3,), float(rank + 1)))
    world_sum = sd.get_world_communicator().all_reduce(torch.full((3,), float(rank + 1)))
    sd.shutdown_distributed()
    return {
        "info": (info.rank, info.world_size, info.tensor_parallel_rank, info.tensor_parallel_size),
        "first": first,
        "initialised_after_shutdown": initialised_after_shutdown,
        "second_tp": (second.tensor_parallel_rank, second.tensor_parallel_size),
        "tp_sum": tp_sum,
        "world_sum": world_sum,
    }


def platform(out: Path) -> dict[str, Any]:
    """Which communicator and backend the selected platform's groups run on."""
    import slotwise

    info = sd.init_distributed(tensor_parallel_size=WORLD)
    tp = sd.get_tp_communicator()
    world = sd.get_world_communicator()
    x = make_input(info.rank, torch.float32, (4, 6), "platform")
    results = {
        "platform": slotwise.current_platform.name,
        "info_backend": info.backend,
        "communicator": type(tp).__name__,
        "backends": (dist.get_backend(tp.group), dist.get_backend(world.group)),
        "process_group": type(tp.group._get_backend(torch.device("cpu"))).__name__,
        "all_reduce": tp.all_reduce(x),
        "op_all_gather": torch.ops.slotwise.tp_all_gather(x, 0, sd.TP_GROUP),
    }
    sd.shutdown_distributed()
    return results


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "collectives": collectives,
    "layers": layers,
    "peer_exits": peer_exits,
    "peer_stuck": peer_stuck,
    "init_only": init_only,
    "platform": platform,
}


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    if scenario == "explicit":
        rank = int(sys.argv[3])
        results = explicit(out, rank)
    else:
        rank = int(os.environ["RANK"])
        results = SCENARIOS[scenario](out)
    partial = out / f"rank{rank}.pt.partial"
    torch.save(results, partial)
    partial.rename(out / f"rank{rank}.pt")  # complete when it appears


if __name__ == "__main__":
    main()
