"""Argument checks shared by the kernel launchers.

A Triton kernel reads whatever memory its pointers and strides describe, so a wrong
shape or dtype gives silent garbage rather than an error: launchers check first and
name the argument and the shape they expected.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(
    name: str,
    tensor: torch.Tensor,
    layout: str,
    shape: Sequence[int | None],
    dtypes: Collection[torch.dtype],
    device: torch.device | None = None,
) -> None:
    """Raise ValueError unless ``tensor`` matches.

    ``layout`` names the dimensions (``"[num_tokens, hidden]"``); ``shape`` holds the
    sizes they must have, None where any size goes. Rows may be strided (slices of a
    larger buffer), but the innermost dimension must be dense: kernels index it directly.
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor of shape {layout}, got {type(tensor)}")
    got = tuple(tensor.shape)
    if len(got) != len(shape) or any(
        e is not None and e != g for e, g in zip(shape, got, strict=True)
    ):
        wanted = ", ".join("?" if e is None else str(e) for e in shape)
        raise ValueError(f"{name}: expected shape {layout} = ({wanted}), got {got}")
    if tensor.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name}: expected dtype in ({names}), got {tensor.dtype}")
    if device is not None and tensor.device != device:
        raise ValueError(f"{name}: expected device {device}, got {tensor.device}")
    if tensor.dim() and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(f"{name}: innermost dimension must have stride 1")
