"""Rotary position embedding (RoPE) applied to queries and keys."""

from __future__ import annotations

import torch

from slotwise.custom_op import CustomOp


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
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.is_neox_style = is_neox_style
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        self.register_buffer(
            "cos_sin_cache", torch.cat([angles.cos(), angles.sin()], dim=-1), persistent=False
        )

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        heads = x.view(x.shape[0], -1, self.head_size).float()
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
