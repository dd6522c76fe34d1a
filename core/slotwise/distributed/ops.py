"""Collectives as torch custom ops, so compiled models keep them in one graph.

Dynamo cannot trace a vendor communicator that calls its own library, so these are
opaque nodes that call, at run time, the communicator registered under ``group_name``
("tp" or "world").  ``tp_all_reduce.out`` writes into a tensor its caller allocated, so
a static graph split at "slotwise::tp_all_reduce" (both overloads) keeps its address.
"""

from __future__ import annotations

import torch

from slotwise.distributed.state import get_communicator

#: Qualified names, e.g. for ``CompilationConfig.splitting_ops`` or graph inspection.
ALL_REDUCE_OP = "slotwise::tp_all_reduce"
ALL_GATHER_OP = "slotwise::tp_all_gather"
REDUCE_SCATTER_OP = "slotwise::tp_reduce_scatter"


@torch.library.custom_op(ALL_REDUCE_OP, mutates_args=())
def tp_all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Sum of ``x`` over the group ``group_name``."""
    return get_communicator(group_name).all_reduce(x)


@tp_all_reduce.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# Registered with torch.library.Library, as the attention op is, which costs less per
# call than custom_op's Python wrappers (see slotwise/attention/ops.py).
_library = torch.library.Library("slotwise", "FRAGMENT")
_library.define("tp_all_reduce.out(Tensor x, str group_name, *, Tensor(a!) out) -> ()")


def _tp_all_reduce_out(x: torch.Tensor, group_name: str, *, out: torch.Tensor) -> None:
    """The sum of ``x`` over the group ``group_name``, written into ``out`` (``x``'s shape)."""
    if out.shape != x.shape:
        raise ValueError(
            f"tp_all_reduce.out: out has shape {tuple(out.shape)} but x has {tuple(x.shape)}; "
            "allocate out like x (torch.empty_like(x))"
        )
    out.copy_(get_communicator(group_name).all_reduce(x))


_library.impl("tp_all_reduce.out", _tp_all_reduce_out, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{ALL_REDUCE_OP}.out")
def _(x: torch.Tensor, group_name: str, *, out: torch.Tensor) -> None:
    return None


@torch.library.custom_op(ALL_GATHER_OP, mutates_args=())
def tp_all_gather(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    """The group's tensors concatenated along ``dim`` in rank order."""
    return get_communicator(group_name).all_gather(x, dim)


@tp_all_gather.register_fake
def _(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= get_communicator(group_name).world_size
    return x.new_empty(shape)


@torch.library.custom_op(REDUCE_SCATTER_OP, mutates_args=())
def tp_reduce_scatter(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    """The sum over the group, split along ``dim``; this rank's chunk."""
    return get_communicator(group_name).reduce_scatter(x, dim)


@tp_reduce_scatter.register_fake
def _(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] //= get_communicator(group_name).world_size
    return x.new_empty(shape)
