"""Where a piece reads its runtime size (the step's token count) among its inputs: the
piecewise backends and the static-graph wrappers key compiled code and graphs by it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def find_size_source(example_inputs: Sequence[Any]) -> tuple[int, int | None] | None:
    """Where the runtime size is read: a symbolic int argument (its value) or the first
    tensor dimension with a symbolic size; None when every input is static."""
    for index, value in enumerate(example_inputs):
        if isinstance(value, torch.SymInt):
            return index, None
    for index, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt):
                    return index, dim
    return None


def batch_sized_inputs(example_inputs: Sequence[Any]) -> list[int]:
    """Indices of the tensor inputs with a symbolic size: the ones that follow the batch,
    as opposed to weights and other fixed tensors."""
    return [
        index
        for index, value in enumerate(example_inputs)
        if isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape)
    ]


def read_size(source: tuple[int, int | None] | None, args: Sequence[Any]) -> int | None:
    """The runtime size at ``source`` (from ``find_size_source``) in ``args``."""
    if source is None:
        return None
    index, dim = source
    return int(args[index]) if dim is None else int(args[index].shape[dim])
