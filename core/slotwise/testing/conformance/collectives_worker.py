"""One rank of the communicator check, started by torchrun.

``python -m torch.distributed.run --nproc-per-node 2 ... -m
slotwise.testing.conformance.collectives_worker OUT_DIR``: each rank joins through
``init_distributed``, runs every collective on the world communicator (the
platform's ``get_communicator_cls()``) and writes what went wrong, per collective,
to ``OUT_DIR/rank<N>.json``.  After the first failure a rank stops: its peer may
be waiting in a collective this rank will never join, and the peer's timeout then
ends the job instead of a hang.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from slotwise.distributed import (
    Communicator,
    get_world_communicator,
    init_distributed,
    shutdown_distributed,
)
from slotwise.distributed.communicator import communicator_class
from slotwise.platforms import get_current_platform


def all_reduce(comm: Communicator) -> None:
    x = torch.full((2, 3), comm.rank + 1.0, device=comm.device)
    total = float(sum(r + 1 for r in range(comm.world_size)))
    expect(comm, "all_reduce(x)", comm.all_reduce(x), torch.full((2, 3), total))
    expect(comm, "all_reduce's input x afterwards", x, torch.full((2, 3), comm.rank + 1.0))


def all_gather(comm: Communicator) -> None:
    x = torch.arange(6.0).reshape(2, 3) + 10 * comm.rank
    parts = [torch.arange(6.0).reshape(2, 3) + 10 * r for r in range(comm.world_size)]
    expect(
        comm, "all_gather(x, dim=0)", comm.all_gather(x.to(comm.device), dim=0), torch.cat(parts, 0)
    )
    expect(
        comm,
        "all_gather(x, dim=-1)",
        comm.all_gather(x.to(comm.device), dim=-1),
        torch.cat(parts, 1),
    )


def reduce_scatter(comm: Communicator) -> None:
    rows = 2 * comm.world_size
    x = torch.arange(rows * 3.0).reshape(rows, 3) + 100 * comm.rank
    total = sum(torch.arange(rows * 3.0).reshape(rows, 3) + 100 * r for r in range(comm.world_size))
    mine = total[2 * comm.rank : 2 * comm.rank + 2]
    expect(comm, "reduce_scatter(x, dim=0)", comm.reduce_scatter(x.to(comm.device), dim=0), mine)


def broadcast(comm: Communicator) -> None:
    x = torch.full((4,), comm.rank + 5.0, device=comm.device)
    expect(comm, "broadcast(x, src=0)", comm.broadcast(x, src=0), torch.full((4,), 5.0))


def send_recv(comm: Communicator) -> None:
    payload = torch.arange(4.0) + 1
    if comm.rank == 0:
        comm.send(payload.to(comm.device), dst=1)
    elif comm.rank == 1:
        expect(comm, "recv((4,), float32, src=0)", comm.recv((4,), torch.float32, src=0), payload)


def barrier(comm: Communicator) -> None:
    comm.barrier()


#: The collectives, in the order every rank runs them.
COLLECTIVES: dict[str, Callable[[Communicator], None]] = {
    "all_reduce": all_reduce,
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
    "broadcast": broadcast,
    "send/recv": send_recv,
    "barrier": barrier,
}


def expect(comm: Communicator, what: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    """``got`` equals ``expected`` in shape, dtype and values, and lies on the rank's device."""
    if got.dtype != expected.dtype or got.device.type != torch.device(comm.device).type:
        raise AssertionError(
            f"{what} gave a {got.dtype} tensor on {got.device}, expected {expected.dtype} on "
            f"{comm.device}"
        )
    if got.shape != expected.shape or not torch.equal(got.cpu(), expected):
        raise AssertionError(f"{what} gave {got.tolist()}, expected {expected.tolist()}")


def run_rank() -> dict[str, str]:
    """What went wrong, by step ("ok" where nothing did)."""
    results: dict[str, str] = {}
    try:
        init_distributed(tensor_parallel_size=1)
        comm = get_world_communicator()
        expected_cls = communicator_class(get_current_platform())
        if not isinstance(comm, expected_cls):
            raise TypeError(
                f"get_world_communicator() is a {type(comm).__name__}, not the platform's "
                f"{expected_cls.__name__}"
            )
        results["init_distributed"] = "ok"
    except Exception as exc:  # noqa: BLE001 - reported to the check
        results["init_distributed"] = f"{type(exc).__name__}: {exc}"
        return results
    try:
        for name, collective in COLLECTIVES.items():
            try:
                collective(comm)
            except Exception as exc:  # noqa: BLE001 - reported to the check
                results[name] = f"{type(exc).__name__}: {exc}"
                break
            results[name] = "ok"
    finally:
        shutdown_distributed()
    return results


def main(argv: list[str]) -> int:
    (out_dir,) = argv
    rank = int(os.environ["RANK"])
    results = run_rank()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
