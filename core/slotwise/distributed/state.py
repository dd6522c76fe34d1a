"""The process's distributed state: ``init_distributed``, the groups, ``shutdown_distributed``.

One world group and one tensor-parallel group per process, each wrapped in the
platform's ``Communicator`` and registered by name ("world", "tp"), which is how
the collective custom ops find them inside compiled graphs.  Ranks ``k * tp`` to
``(k + 1) * tp - 1`` form tensor-parallel group ``k``, so a group never spans more
machines than it must when torchrun numbers ranks node by node.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import re
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from slotwise.distributed.communicator import Communicator, communicator_class
from slotwise.distributed.errors import DistributedInitError
from slotwise.distributed.launch import LaunchConfig, resolve_launch_config
from slotwise.platforms import Platform

logger = logging.getLogger(__name__)

#: Names of the groups, as ``get_communicator`` and the collective ops take them.
WORLD_GROUP = "world"
TP_GROUP = "tp"


@dataclass(frozen=True)
class DistributedInfo:
    """Where this process sits, as ``init_distributed`` set it up."""

    rank: int
    world_size: int
    local_rank: int
    tensor_parallel_rank: int
    tensor_parallel_size: int
    backend: str
    timeout_s: float


@dataclass
class _State:
    info: DistributedInfo
    communicators: dict[str, Communicator]
    world_group: dist.ProcessGroup
    tp_group: dist.ProcessGroup
    #: False when torch.distributed was initialised by someone else, who then owns it.
    owns_default_group: bool


_state: _State | None = None
_lock = threading.Lock()
_exit_hook_registered = False


def init_distributed(
    tensor_parallel_size: int = 1,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    init_method: str | None = None,
    backend: str | None = None,
    timeout: float | datetime.timedelta | None = None,
) -> DistributedInfo:
    """Join the job, build the world and tensor-parallel groups, and return where we sit.

    Under torchrun call it with the tensor-parallel size only; rank, world size and
    rendezvous come from the environment.  Without torchrun pass ``rank``,
    ``world_size`` and ``init_method``; with nothing at all the process runs alone.
    ``backend`` defaults to ``current_platform.dist_backend``; ``timeout`` (seconds or
    a timedelta) to SLOTWISE_DIST_TIMEOUT, else 600 s, and bounds the rendezvous and
    every collective.  Calling it again with the same tensor-parallel size returns
    the same answer; anything else needs ``shutdown_distributed()`` first.
    """
    global _state, _exit_hook_registered
    with _lock:
        if not _exit_hook_registered:
            # Groups still open when the interpreter exits make gloo (maybe other backends
            # too) abort with "terminate called without an active exception".
            atexit.register(shutdown_distributed)
            _exit_hook_registered = True
        if _state is not None:
            if tensor_parallel_size == _state.info.tensor_parallel_size:
                return _state.info
            raise DistributedInitError(
                "distributed is already initialised with tensor_parallel_size="
                f"{_state.info.tensor_parallel_size}; call shutdown_distributed() before "
                f"init_distributed(tensor_parallel_size={tensor_parallel_size})"
            )
        joined = dist.is_initialized()
        if joined:
            _check_agrees_with_torch(rank, world_size)
            rank, world_size = dist.get_rank(), dist.get_world_size()
        launch = resolve_launch_config(
            tensor_parallel_size,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            init_method=init_method,
            timeout=timeout,
            joined=joined,
        )
        _state = _build_state(launch, backend)
    info = _state.info
    logger.info(
        "distributed: rank %d of %d (local rank %d), tensor parallel rank %d of %d, "
        "backend %s, timeout %g s",
        info.rank,
        info.world_size,
        info.local_rank,
        info.tensor_parallel_rank,
        info.tensor_parallel_size,
        info.backend,
        info.timeout_s,
    )
    return info


def shutdown_distributed() -> None:
    """Destroy the communicators and the groups slotwise created; safe to call twice.

    Call it on every rank after the last collective; it also runs at interpreter
    exit, for programs that do not.  A default group created by someone else before
    ``init_distributed`` is left to its owner, and groups already destroyed through
    torch.distributed are skipped.
    """
    global _state
    with _lock:
        state, _state = _state, None
    if state is None:
        return
    for communicator in state.communicators.values():
        communicator.destroy()
    # Another default group, or none, means the user destroyed the one we joined, and
    # every group with it.
    if dist.group.WORLD is state.world_group:
        _destroy_groups(state.owns_default_group, state.tp_group)
    logger.info("distributed: shut down rank %d", state.info.rank)


def is_initialized() -> bool:
    """Whether ``init_distributed`` has run (and ``shutdown_distributed`` has not since)."""
    return _state is not None


def get_communicator(name: str) -> Communicator:
    """The communicator of group ``name`` ("world" or "tp")."""
    state = _state
    if state is None:
        raise DistributedInitError(
            f"no distributed group {name!r}: call slotwise.distributed.init_distributed() first"
        )
    if name not in state.communicators:
        raise DistributedInitError(
            f"no distributed group {name!r}; the groups are {', '.join(state.communicators)}"
        )
    return state.communicators[name]


def get_world_communicator() -> Communicator:
    """The communicator over every process of the job."""
    return get_communicator(WORLD_GROUP)


def get_tp_communicator() -> Communicator:
    """The communicator over this process's tensor-parallel group."""
    return get_communicator(TP_GROUP)


def get_tensor_parallel_rank() -> int:
    """This process's rank in its tensor-parallel group; 0 when not initialised."""
    state = _state
    return 0 if state is None else state.info.tensor_parallel_rank


def get_tensor_parallel_world_size() -> int:
    """The tensor-parallel size; 1 when not initialised, so models run single-process."""
    state = _state
    return 1 if state is None else state.info.tensor_parallel_size


def _check_agrees_with_torch(rank: int | None, world_size: int | None) -> None:
    """An already initialised torch.distributed fixes rank and world size."""
    for argument, value, actual in (
        ("rank", rank, dist.get_rank()),
        ("world_size", world_size, dist.get_world_size()),
    ):
        if value is not None and value != actual:
            raise DistributedInitError(
                f"init_distributed({argument}={value}) contradicts torch.distributed, which is "
                f"already initialised with {argument} {actual}; drop the argument"
            )


def _build_state(launch: LaunchConfig, backend: str | None) -> _State:
    from slotwise.platforms import current_platform

    # Asked first: a vendor platform registers its torch.distributed backend here.
    communicator_cls = communicator_class(current_platform)
    backend = backend or current_platform.dist_backend
    if backend not in dist.Backend.backend_list:
        raise DistributedInitError(
            f"torch.distributed has no backend {backend!r}; the known ones are "
            f"{', '.join(dist.Backend.backend_list)} (a vendor plugin registers its own in "
            "Platform.get_communicator_cls)"
        )
    device = _claim_device(current_platform, launch.local_rank)
    timeout = datetime.timedelta(seconds=launch.timeout_s)
    owns_default_group = not dist.is_initialized()
    try:
        if owns_default_group:
            _init_default_group(launch, backend, timeout)
        tp_group = _new_tp_group(launch, timeout)
    except BaseException as error:  # even Ctrl-C: no half-built group may outlive init
        _destroy_groups(owns_default_group, None)
        if isinstance(error, (RuntimeError, ValueError)):  # DistError is a RuntimeError
            raise _rendezvous_error(launch, error) from error
        raise
    try:
        communicators = {
            name: communicator_cls(group, name=name, device=device, timeout=timeout)
            for name, group in ((WORLD_GROUP, dist.group.WORLD), (TP_GROUP, tp_group))
        }
    except BaseException:
        _destroy_groups(owns_default_group, tp_group)
        raise
    info = DistributedInfo(
        rank=launch.rank,
        world_size=launch.world_size,
        local_rank=launch.local_rank,
        tensor_parallel_rank=communicators[TP_GROUP].rank,
        tensor_parallel_size=launch.tensor_parallel_size,
        backend=dist.get_backend(),
        timeout_s=launch.timeout_s,
    )
    return _State(info, communicators, dist.group.WORLD, tp_group, owns_default_group)


def _claim_device(platform: Platform, local_rank: int) -> torch.device:
    """One device per local rank, on platforms that have devices to choose between."""
    if platform.device_control_env_var:
        try:
            platform.set_device(local_rank)
        except (ValueError, RuntimeError) as error:
            raise DistributedInitError(
                f"local rank {local_rank} has no {platform.name} device of its own ({error}); "
                "start at most as many processes per machine as it has devices, or make more "
                f"visible ({platform.device_control_env_var})"
            ) from error
    if platform.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(platform.device_type, local_rank)


def _init_default_group(launch: LaunchConfig, backend: str, timeout: datetime.timedelta) -> None:
    if launch.init_method is None:
        # A lone process: an in-memory store instead of a network rendezvous.
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
        return
    dist.init_process_group(
        backend,
        init_method=launch.init_method,
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=timeout,
    )


def _new_tp_group(launch: LaunchConfig, timeout: datetime.timedelta) -> dist.ProcessGroup:
    """Create every tensor-parallel group (all ranks must, in the same order); keep ours."""
    size = launch.tensor_parallel_size
    mine = None
    for start in range(0, launch.world_size, size):
        ranks = list(range(start, start + size))
        # The timeout must be passed again: new groups do not inherit the world's.
        group = dist.new_group(ranks, timeout=timeout)
        if launch.rank in ranks:
            mine = group
    assert mine is not None
    return mine


def _destroy_groups(owns_default_group: bool, tp_group: dist.ProcessGroup | None) -> None:
    """Destroy what slotwise created: the default group, which takes every other group
    with it, when slotwise made it; else only the tensor-parallel group.  Also undoes a
    failed init, so a corrected one can be retried."""
    if owns_default_group and dist.is_initialized():
        dist.destroy_process_group()
    elif tp_group is not None:
        dist.destroy_process_group(tp_group)


def _rendezvous_error(launch: LaunchConfig, error: Exception) -> DistributedInitError:
    lines = str(error).strip().splitlines()
    cause = lines[0] if lines else type(error).__name__
    where = (
        f"rank {launch.rank} of {launch.world_size} could not set up the process groups "
        f"through {launch.rendezvous} within {launch.timeout_s:g} s"
    )
    if "connect" in cause.lower():
        advice = (
            "nothing answered there: check the address and port (MASTER_ADDR and MASTER_PORT, "
            "or init_method), that rank 0 is running, and that the port is reachable"
        )
    else:
        joined = re.search(r"(\d+)/\d+ clients joined", cause)
        count = f"only {joined.group(1)} of" if joined else "not all"
        advice = (
            f"{count} {launch.world_size} processes joined: check that WORLD_SIZE matches the "
            "number of processes started (torchrun: --nnodes x --nproc-per-node) and that none "
            "of them failed to start; if they start slowly, raise SLOTWISE_DIST_TIMEOUT"
        )
    return DistributedInitError(f"{where}: {advice}. Backend said: {cause}")
