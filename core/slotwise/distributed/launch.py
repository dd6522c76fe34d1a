"""Where this process sits in the job: rank, world size, rendezvous and timeout.

From ``init_distributed``'s arguments or torchrun's environment, checked before any
process is contacted, so an inconsistent launch fails at once.  No torch here.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

from slotwise import envs
from slotwise.distributed.errors import DistributedInitError

#: Seconds a rendezvous or collective may take when neither ``timeout=`` nor
#: SLOTWISE_DIST_TIMEOUT says otherwise (NCCL's own default).
DEFAULT_TIMEOUT_S = envs.DEFAULT_DIST_TIMEOUT_S
#: The longest timeout accepted: a job stuck for longer is better failed and restarted.
MAX_TIMEOUT_S = envs.MAX_DIST_TIMEOUT_S


@dataclass(frozen=True)
class LaunchConfig:
    """The checked description of one process of a distributed job."""

    rank: int
    world_size: int
    local_rank: int
    tensor_parallel_size: int
    #: torch.distributed init method ("env://", "tcp://host:port", "file:///path");
    #: ``None`` where no rendezvous is needed: a lone process, or one whose
    #: torch.distributed was initialised before.
    init_method: str | None
    timeout_s: float
    #: The rendezvous as a user would recognise it in an error message.
    rendezvous: str


def resolve_launch_config(
    tensor_parallel_size: int = 1,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    init_method: str | None = None,
    timeout: float | datetime.timedelta | None = None,
    joined: bool = False,
) -> LaunchConfig:
    """Combine the arguments with torchrun's environment (which they must not contradict),
    checking every value; with neither, the process runs alone.  ``joined``:
    torch.distributed is already initialised."""
    tensor_parallel_size = _positive_int("tensor_parallel_size", tensor_parallel_size)
    rank = _merge("rank", rank, "RANK")
    world_size = _merge("world_size", world_size, "WORLD_SIZE")
    if rank is None and world_size is None and init_method is None:
        rank, world_size = 0, 1
    elif rank is None or world_size is None:
        raise DistributedInitError(
            "init_distributed needs both a rank and a world size: start the processes with "
            "torchrun (it sets RANK and WORLD_SIZE) or pass rank= and world_size= together"
        )
    world_size = _positive_int("world_size", world_size)
    if not 0 <= rank < world_size:
        raise DistributedInitError(
            f"rank {rank} is outside the world of {world_size} processes; "
            f"ranks run from 0 to {world_size - 1}"
        )
    if world_size % tensor_parallel_size:
        raise DistributedInitError(
            f"tensor_parallel_size={tensor_parallel_size} does not divide the world size "
            f"{world_size}; start a multiple of {tensor_parallel_size} processes or pick a "
            f"tensor_parallel_size that divides {world_size}"
        )
    local_rank = _merge("local_rank", local_rank, "LOCAL_RANK")
    if joined:
        init_method, rendezvous = None, "the torch.distributed group initialised before"
    else:
        init_method = _init_method(init_method, world_size)
        rendezvous = _describe(init_method)
    return LaunchConfig(
        rank=rank,
        world_size=world_size,
        local_rank=rank if local_rank is None else local_rank,
        tensor_parallel_size=tensor_parallel_size,
        init_method=init_method,
        timeout_s=_timeout_seconds(timeout),
        rendezvous=rendezvous,
    )


def _merge(argument: str, value: int | None, variable: str) -> int | None:
    """``value`` or the environment's; both present must agree."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return value
    try:
        from_env = int(raw)
    except ValueError:
        raise DistributedInitError(
            f"{variable}={raw!r} is not an integer; fix or unset it (torchrun sets it for you)"
        ) from None
    if value is not None and value != from_env:
        raise DistributedInitError(
            f"init_distributed({argument}={value}) contradicts {variable}={from_env} in the "
            f"environment (set by torchrun); drop the argument or make them agree"
        )
    return from_env


def _positive_int(argument: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DistributedInitError(f"{argument} must be a positive integer, got {value!r}")
    return value


def _init_method(init_method: str | None, world_size: int) -> str | None:
    if init_method is not None:
        return init_method
    have_master = all(os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT"))
    if world_size == 1 and not have_master:
        return None
    if not have_master:
        raise DistributedInitError(
            f"a world of {world_size} processes needs a rendezvous: start them with torchrun, "
            "set MASTER_ADDR and MASTER_PORT, or pass init_method= "
            "('tcp://host:port' or 'file:///shared/path')"
        )
    return "env://"


def _describe(init_method: str | None) -> str:
    if init_method is None:
        return "an in-memory store (single process)"
    if init_method == "env://":
        address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        return f"{address} (MASTER_ADDR:MASTER_PORT)"
    return init_method


def _timeout_seconds(timeout: float | datetime.timedelta | None) -> float:
    """``timeout=``, else SLOTWISE_DIST_TIMEOUT, else the default, checked against
    ``MAX_TIMEOUT_S`` before torch sees it: torch overflows on huge values."""
    if timeout is None:
        return envs.dist_timeout()  # raises EnvironmentVariableError for a junk value
    accepted = f"a finite number of seconds above 0 and at most {MAX_TIMEOUT_S:g} (7 days)"
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not _in_range(seconds):
        raise DistributedInitError(
            f"timeout={timeout!r} is not {accepted}; "
            "pass for example timeout=300 or a datetime.timedelta"
        )
    return float(seconds)


def _in_range(seconds: float) -> bool:
    return 0 < seconds <= MAX_TIMEOUT_S  # False for nan; inf is above the maximum
