"""Rotary position embedding (RoPE) applied to queries and keys."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from slotwise.custom_op import CustomOp


@dataclass(frozen=True)
class RopeScaling:
    """How a checkpoint stretches RoPE beyond the context it was trained on.

    ``"linear"`` divides every frequency by ``factor`` (position interpolation).
    ``"llama3"`` divides only the frequencies whose wavelength is longer than
    ``original_max_position / low_freq_factor``, keeps those shorter than
    ``original_max_position / high_freq_factor``, and blends linearly in between.
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(
                f"rope scaling type {self.rope_type!r} is not supported; "
                "slotwise implements 'linear' and 'llama3'"
            )

    def apply(self, inv_freq: torch.Tensor) -> torch.Tensor:
        if self.rope_type == "linear":
            return inv_freq / self.factor
        wavelength = 2 * math.pi / inv_freq
        # 0 where the frequency is scaled entirely, 1 where it is kept.
        keep = (self.original_max_position / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        keep = keep.clamp(0.0, 1.0)
        return (1 - keep) * inv_freq / self.factor + keep * inv_freq


class RotaryEmbedding(CustomOp):
    """Rotates each head's vector by position-dependent angles.

    ``cos_sin_cache[position]`` holds ``rotary_dim / 2`` cosines then as many sines.
    Neox style rotates the two halves of the head; GPT-J style rotates interleaved
    pairs.  Inputs are ``[num_tokens, num_heads * head_size]``.
    """

    op_name = "rotary_embedding"

    def __init__(
        self,
        head_size: int,
        max_position: int,
        base: float = 10000.0,
        is_neox_style: bool = True,
        scaling: RopeScaling | None = None,
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.max_position = max_position
        self.base = base
        self.is_neox_style = is_neox_style
        self.scaling = scaling
        if torch.empty(0).is_meta:
            # Built on meta: only the shape is needed now (torch's meta kernels for the
            # table would import Dynamo, a second of start-up); it is computed with memory.
            table = torch.empty(max_position, head_size, dtype=torch.float32)
        else:
            table = self.compute_cos_sin_cache()
        self.register_buffer("cos_sin_cache", table, persistent=False)

    def compute_cos_sin_cache(self) -> torch.Tensor:
        """The table of every position's angles, in float32 on the current default device.

        A model built on the meta device (to load a checkpoint without drawing weights)
        recomputes its table with this once it has real memory.
        """
        exponents = torch.arange(0, self.head_size, 2, dtype=torch.float32) / self.head_size
        inv_freq = 1.0 / (self.base**exponents)
        if self.scaling is not None:
            inv_freq = self.scaling.apply(inv_freq)
        angles = torch.outer(torch.arange(self.max_position, dtype=torch.float32), inv_freq)
        return torch.cat([angles.cos(), angles.sin()], dim=-1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], x.shape[1] // self.head_size, self.head_size).float()
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        if self.is_neox_style:
            first, second = heads.chunk(2, dim=-1)
            rotated = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
        else:
            first, second = heads[..., 0::2], heads[..., 1::2]
            rotated = torch.stack([first * cos - second * sin, second * cos + first * sin], dim=-1)
            rotated = rotated.flatten(-2)
        return rotated.to(x.dtype).view_as(x)

    def forward_native(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, max_position={self.max_position}, base={self.base}, "
            f"scaling={self.scaling}"
        )
