"""Launch settings are checked before any process is contacted, each error naming the fix.

No process groups here: ``resolve_launch_config`` only reads its arguments and the
environment torchrun would set.
"""

from __future__ import annotations

import datetime

import pytest
from support import LAUNCHER_VARIABLES

from slotwise.distributed import DEFAULT_TIMEOUT_S, DistributedInitError
from slotwise.distributed.launch import MAX_TIMEOUT_S, resolve_launch_config
from slotwise.errors import EnvironmentVariableError


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*LAUNCHER_VARIABLES, "SLOTWISE_DIST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


def torchrun(monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int) -> None:
    for name, value in {
        "RANK": rank,
        "WORLD_SIZE": world_size,
        "LOCAL_RANK": rank,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": 29999,
    }.items():
        monkeypatch.setenv(name, str(value))


def test_without_a_launcher_the_process_runs_alone():
    launch = resolve_launch_config()
    assert (launch.rank, launch.world_size, launch.local_rank) == (0, 1, 0)
    assert launch.init_method is None and launch.timeout_s == DEFAULT_TIMEOUT_S
    assert launch.rendezvous == "an in-memory store (single process)"


def test_an_initialised_torch_distributed_needs_no_rendezvous(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    launch = resolve_launch_config(2, joined=True)
    assert (launch.rank, launch.world_size, launch.init_method) == (1, 2, None)


def test_torchruns_environment_gives_ranks_and_the_env_rendezvous(monkeypatch):
    torchrun(monkeypatch, 1, 4)
    launch = resolve_launch_config(2)
    assert (launch.rank, launch.world_size, launch.local_rank) == (1, 4, 1)
    assert launch.init_method == "env://"
    assert launch.rendezvous == "127.0.0.1:29999 (MASTER_ADDR:MASTER_PORT)"


def test_explicit_arguments_need_no_environment():
    launch = resolve_launch_config(2, rank=3, world_size=4, init_method="file:///tmp/x")
    assert (launch.rank, launch.world_size, launch.local_rank) == (3, 4, 3)
    assert launch.init_method == "file:///tmp/x"


def test_the_timeout_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.setenv("SLOTWISE_DIST_TIMEOUT", "5")
    assert resolve_launch_config().timeout_s == 5.0
    assert resolve_launch_config(timeout=2.5).timeout_s == 2.5
    assert resolve_launch_config(timeout=datetime.timedelta(minutes=1)).timeout_s == 60.0


@pytest.mark.parametrize("value", ["1e300", "nan", "-5", "abc", "inf", "0", "604800.5"])
def test_a_junk_timeout_variable_names_itself_its_value_and_the_range(monkeypatch, value):
    monkeypatch.setenv("SLOTWISE_DIST_TIMEOUT", value)
    with pytest.raises(EnvironmentVariableError) as raised:
        resolve_launch_config()
    assert str(raised.value).startswith(f"SLOTWISE_DIST_TIMEOUT={value!r} is not")
    assert "a number > 0 and <= 604800 (default 600)" in str(raised.value)


def test_seven_days_is_the_longest_timeout(monkeypatch):
    monkeypatch.setenv("SLOTWISE_DIST_TIMEOUT", "604800")
    assert resolve_launch_config().timeout_s == MAX_TIMEOUT_S == 604800
    assert resolve_launch_config(timeout=datetime.timedelta(days=7)).timeout_s == MAX_TIMEOUT_S
    with pytest.raises(DistributedInitError, match=r"at most 604800 \(7 days\)"):
        resolve_launch_config(timeout=datetime.timedelta(days=7, seconds=1))


@pytest.mark.parametrize(
    "setup, kwargs, message",
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, {"tensor_parallel_size": 3}, "does not divide"),
        ({}, {"tensor_parallel_size": 0}, "tensor_parallel_size must be a positive integer"),
        ({}, {"rank": 2, "world_size": 2, "init_method": "tcp://h:1"}, "outside the world of 2"),
        ({}, {"rank": 0}, "needs both a rank and a world size"),
        ({}, {"init_method": "tcp://h:1"}, "needs both a rank and a world size"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, {"rank": 1}, r"rank=1\) contradicts RANK=0"),
        ({"RANK": "zero", "WORLD_SIZE": "2"}, {}, "RANK='zero' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, {}, "set MASTER_ADDR and MASTER_PORT"),
        ({}, {"timeout": 0}, "timeout=0 is not a finite number of seconds above 0"),
        ({}, {"timeout": 1e300}, r"timeout=1e\+300 is not a finite number of seconds above 0"),
    ],
)
def test_an_inconsistent_launch_is_refused_at_once(monkeypatch, setup, kwargs, message):
    for name, value in setup.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DistributedInitError, match=message):
        resolve_launch_config(**kwargs)
