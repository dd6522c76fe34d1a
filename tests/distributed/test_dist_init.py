"""``init_distributed`` and ``shutdown_distributed``: alone in this process, and two
processes joined by explicit rank, world size and a file:// rendezvous."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_worker import WORLD
from support import LAUNCHER_VARIABLES, process_env, run_together

import slotwise.distributed as sd
from slotwise.errors import EnvironmentVariableError
from slotwise.platforms import Platform, use_platform
from slotwise.plugin_api import Communicator

WORKER = Path(__file__).with_name("dist_worker.py")
#: A torch.distributed backend of the tests' own: gloo under another name.
OTHER_BACKEND = "gloo_renamed_for_tests"


class GlooCommunicator(Communicator):
    dist_backend = "gloo"


class GlooPlatform(Platform):
    """A CPU platform whose groups run on gloo, with a communicator that insists on it."""

    name = "gloo_test"
    device_type = "cpu"

    def get_communicator_cls(self, **kwargs: object) -> type[Communicator]:
        return GlooCommunicator


def register_other_backend() -> None:
    if OTHER_BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(
            OTHER_BACKEND,
            lambda store, rank, size, timeout: dist.ProcessGroupGloo(store, rank, size, timeout),
            devices=["cpu"],
        )


@pytest.fixture
def alone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher environment, a gloo platform, and a shutdown whatever happens."""
    for name in (*LAUNCHER_VARIABLES, "SLOTWISE_DIST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    with use_platform(GlooPlatform()):
        yield
    sd.shutdown_distributed()


def test_a_lone_process_needs_no_rendezvous_and_shuts_down_cleanly(alone):
    info = sd.init_distributed()
    assert info == sd.DistributedInfo(0, 1, 0, 0, 1, "gloo", sd.DEFAULT_TIMEOUT_S)
    assert sd.is_initialized() and sd.init_distributed(tensor_parallel_size=1) == info
    tp, world = sd.get_tp_communicator(), sd.get_world_communicator()
    assert type(tp) is GlooCommunicator and (tp.name, world.name) == ("tp", "world")
    assert (tp.rank, tp.world_size, tp.ranks) == (0, 1, [0])

    x = torch.arange(6.0).view(2, 3)
    for result in (tp.all_reduce(x), tp.all_gather(x, 0), tp.reduce_scatter(x, 1), tp.gather(x)):
        assert torch.equal(result, x) and result is not x
    assert tp.broadcast(x) is x
    tp.barrier()

    def step(t: torch.Tensor) -> torch.Tensor:
        return torch.ops.slotwise.tp_all_reduce(t, sd.TP_GROUP) + 1

    assert torch.equal(torch.compile(step, fullgraph=True, backend="eager")(x), x + 1)

    with pytest.raises(sd.DistributedInitError, match="already initialised with tensor_par"):
        sd.init_distributed(tensor_parallel_size=2)
    sd.shutdown_distributed()
    sd.shutdown_distributed()  # twice is fine
    assert not dist.is_initialized() and not sd.is_initialized()
    assert sd.get_tensor_parallel_world_size() == 1 and sd.get_tensor_parallel_rank() == 0
    with pytest.raises(sd.DistributedInitError, match=r"call slotwise.distributed.init_distr"):
        sd.get_tp_communicator()
    with pytest.raises(sd.DistributedInitError, match=r"after shutdown_distributed\(\)"):
        tp.all_reduce(x)


def test_bad_collective_arguments_name_the_problem(alone):
    sd.init_distributed()
    tp = sd.get_tp_communicator()
    with pytest.raises(ValueError, match=r"dim 2 is out of range for a tensor of shape \(2, 3\)"):
        tp.all_gather(torch.zeros(2, 3), dim=2)
    with pytest.raises(ValueError, match="src=1 is not a rank of group 'tp'"):
        tp.broadcast(torch.zeros(2), src=1)
    with pytest.raises(ValueError, match="must be contiguous"):
        tp.broadcast(torch.zeros(2, 3).T)
    with pytest.raises(ValueError, match="point-to-point needs a peer"):
        tp.send(torch.zeros(2), dst=0)


def test_the_communicator_refuses_a_group_of_the_wrong_backend(alone):
    register_other_backend()
    with pytest.raises(sd.DistributedInitError, match="runs on the 'gloo' backend, but group"):
        sd.init_distributed(backend=OTHER_BACKEND)
    assert not dist.is_initialized() and not sd.is_initialized()
    with pytest.raises(sd.DistributedInitError, match="torch.distributed has no backend 'nope'"):
        sd.init_distributed(backend="nope")


def test_a_torch_distributed_initialised_before_is_used_and_left_to_its_owner(alone):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(sd.DistributedInitError, match=r"world_size=2\) contradicts"):
            sd.init_distributed(world_size=2)
        info = sd.init_distributed()
        assert (info.rank, info.world_size, info.backend) == (0, 1, "gloo")
        assert sd.get_world_communicator().group is dist.group.WORLD
        sd.shutdown_distributed()
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("owned", [True, False], ids=["slotwise_owned", "user_owned"])
def test_shutdown_leaves_alone_a_default_group_the_user_made_after_destroying_ours(alone, owned):
    def user_group() -> None:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    if not owned:
        user_group()
    sd.init_distributed()
    dist.destroy_process_group()  # ours (with the tp group), or the user's own
    user_group()
    try:
        sd.shutdown_distributed()
        assert dist.is_initialized() and not sd.is_initialized()
    finally:
        dist.destroy_process_group()


def test_an_init_interrupted_halfway_leaves_no_group_behind(alone, monkeypatch):
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("slotwise.distributed.state._new_tp_group", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sd.init_distributed()  # after the default group was made
    assert not dist.is_initialized() and not sd.is_initialized()


def test_a_timeout_out_of_range_is_refused_before_torch_sees_it(alone, monkeypatch):
    monkeypatch.setenv("SLOTWISE_DIST_TIMEOUT", "1e300")  # an OverflowError inside torch
    with pytest.raises(EnvironmentVariableError, match=r"SLOTWISE_DIST_TIMEOUT='1e300' is not"):
        sd.init_distributed()
    assert not dist.is_initialized() and not sd.is_initialized()


@pytest.mark.slow
def test_two_processes_join_by_explicit_rank_world_size_and_init_method(tmp_path):
    commands = [
        ([sys.executable, str(WORKER), "explicit", str(tmp_path), str(rank)], process_env())
        for rank in range(WORLD)
    ]
    for rank, finished in enumerate(run_together(commands, timeout=60)):
        assert finished.returncode == 0, f"rank {rank}:\n{finished.stderr[-6000:]}"
    for rank in range(WORLD):
        results = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert results["info"] == (rank, 2, rank, 2)
        assert torch.equal(results["first"], torch.full((3,), 3.0))
        assert results["initialised_after_shutdown"] is False
        # Initialised again with one rank per tensor-parallel group.
        assert results["second_tp"] == (0, 1)
        assert torch.equal(results["tp_sum"], torch.full((3,), float(rank + 1)))
        assert torch.equal(results["world_sum"], torch.full((3,), 3.0))
