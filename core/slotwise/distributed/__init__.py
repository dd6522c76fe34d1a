"""Distributed execution: communicators, process groups and tensor-parallel layers.

Imported only on use (it imports torch): ``import slotwise`` stays cheap.  Start the
processes with torchrun and call ``init_distributed(tensor_parallel_size=...)`` in
each; docs/distributed.md has the walk-through for users and plugin authors.
"""

from __future__ import annotations

from slotwise.distributed.agreement import Fact, check_ranks_agree
from slotwise.distributed.communicator import Communicator
from slotwise.distributed.errors import (
    CollectiveError,
    DistributedError,
    DistributedInitError,
    DistributedTimeoutError,
    RankDisagreementError,
)
from slotwise.distributed.launch import DEFAULT_TIMEOUT_S
from slotwise.distributed.ops import tp_all_gather, tp_all_reduce, tp_reduce_scatter
from slotwise.distributed.parallel_layers import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from slotwise.distributed.state import (
    TP_GROUP,
    WORLD_GROUP,
    DistributedInfo,
    get_communicator,
    get_tensor_parallel_rank,
    get_tensor_parallel_world_size,
    get_tp_communicator,
    get_world_communicator,
    init_distributed,
    is_initialized,
    shutdown_distributed,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TP_GROUP",
    "WORLD_GROUP",
    "CollectiveError",
    "ColumnParallelLinear",
    "Communicator",
    "DistributedError",
    "DistributedInfo",
    "DistributedInitError",
    "DistributedTimeoutError",
    "Fact",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RankDisagreementError",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "check_ranks_agree",
    "get_communicator",
    "get_tensor_parallel_rank",
    "get_tensor_parallel_world_size",
    "get_tp_communicator",
    "get_world_communicator",
    "init_distributed",
    "is_initialized",
    "shutdown_distributed",
    "tp_all_gather",
    "tp_all_reduce",
    "tp_reduce_scatter",
]
