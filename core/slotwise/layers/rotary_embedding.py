"""Rotary position embedding (RoPE) applied to queries and keys."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from slotwise.custom_op import CustomOp

#: The scaling types ``RopeScaling`` implements.
ROPE_SCALING_TYPES = ("linear", "llama3", "dynamic", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """How a checkpoint stretches RoPE beyond the context it was trained on.

    ``"linear"`` divides every frequency by ``factor`` (position interpolation).
    ``"llama3"`` divides only the frequencies whose wavelength is longer than
    ``original_max_position / low_freq_factor``, keeps those shorter than
    ``original_max_position / high_freq_factor``, and blends linearly in between.
    ``"yarn"`` blends divided and kept frequencies over the dimensions whose number
    of rotations within ``original_max_position`` lies between ``beta_slow`` and
    ``beta_fast``, and multiplies cos and sin by ``attention_factor``.
    ``"dynamic"`` (NTK) raises the base with the sequence length once it passes
    ``original_max_position``, so its angles are computed per step, not tabled.
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_SCALING_TYPES:
            raise ValueError(
                f"rope scaling type {self.rope_type!r} is not supported; "
                f"slotwise implements {', '.join(map(repr, ROPE_SCALING_TYPES))}"
            )

    @property
    def length_dependent(self) -> bool:
        """Whether the frequencies depend on the sequence length (``dynamic``)."""
        return self.rope_type == "dynamic"

    def inv_freq(self, base: float, dim: int) -> torch.Tensor:
        """The scaled inverse frequencies of a ``dim``-wide head (float32); for
        ``dynamic``, those of sequences up to ``original_max_position``."""
        exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
        wavelengths = base**exponents  # over 2 pi
        if self.rope_type == "linear":
            return 1.0 / wavelengths / self.factor
        if self.rope_type == "llama3":
            return self._llama3(1.0 / wavelengths)
        if self.rope_type == "yarn":
            return self._yarn(wavelengths, base, dim)
        return 1.0 / wavelengths

    def _llama3(self, inv_freq: torch.Tensor) -> torch.Tensor:
        wavelength = 2 * math.pi / inv_freq
        # 0 where the frequency is scaled entirely, 1 where it is kept.
        keep = (self.original_max_position / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        keep = keep.clamp(0.0, 1.0)
        return (1 - keep) * inv_freq / self.factor + keep * inv_freq

    def _yarn(self, wavelengths: torch.Tensor, base: float, dim: int) -> torch.Tensor:
        def dimension(rotations: float) -> float:
            # The dimension that turns ``rotations`` times over the original context.
            turns = self.original_max_position / (rotations * 2 * math.pi)
            return dim * math.log(turns) / (2 * math.log(base))

        low, high = dimension(self.beta_fast), dimension(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # a ramp of width zero would divide by zero
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1: extrapolated (kept), 0: interpolated (divided by factor)
        return 1.0 / (self.factor * wavelengths) * (1 - keep) + 1.0 / wavelengths * keep


def yarn_attention_factor(
    factor: float, mscale: float | None, mscale_all_dim: float | None
) -> float:
    """YaRN's default cos/sin multiplier: ``0.1 * m * ln(factor) + 1`` (1 for factor <= 1),
    as a ratio of two such terms when the config gives both ``mscale`` and ``mscale_all_dim``."""

    def term(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if mscale and mscale_all_dim:
        return term(mscale) / term(mscale_all_dim)
    return term(1.0)


class RotaryEmbedding(CustomOp):
    """Rotates each head's vector by position-dependent angles.

    ``cos_sin_cache[position]`` holds ``rotary_dim / 2`` cosines then as many sines;
    it has ``max_position`` rows, the longest context the model serves.  Neox style
    rotates the two halves of the head; GPT-J style rotates interleaved pairs.
    Inputs are ``[num_tokens, num_heads * head_size]``.

    Length-dependent (``dynamic``) scaling has no table: each step computes its
    angles from the step's longest sequence, as transformers does, so it always runs
    this native code (a plugin's kernel reads the table).
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
        if scaling is not None and scaling.length_dependent:
            self._forward_impl, self.implementation = self.forward_native, "native"
        rows = 0 if scaling is not None and scaling.length_dependent else max_position
        if torch.empty(0).is_meta:
            # Built on meta: only the shape is needed now (torch's meta kernels for the
            # table would import Dynamo, a second of start-up); it is computed with memory.
            table = torch.empty(rows, head_size, dtype=torch.float32)
        else:
            table = self.compute_cos_sin_cache()
        self.register_buffer("cos_sin_cache", table, persistent=False)

    def compute_cos_sin_cache(self) -> torch.Tensor:
        """The table of every position's angles, in float32 on the current default device
        (no rows for length-dependent scaling).

        A model built on the meta device (to load a checkpoint without drawing weights)
        recomputes its table with this once it has real memory.
        """
        if self.scaling is None:
            exponents = torch.arange(0, self.head_size, 2, dtype=torch.float32) / self.head_size
            inv_freq = 1.0 / (self.base**exponents)
        elif self.scaling.length_dependent:
            return torch.empty(0, self.head_size, dtype=torch.float32)
        else:
            inv_freq = self.scaling.inv_freq(self.base, self.head_size)
        angles = torch.outer(torch.arange(self.max_position, dtype=torch.float32), inv_freq)
        magnitude = 1.0 if self.scaling is None else self.scaling.attention_factor
        return torch.cat([angles.cos() * magnitude, angles.sin() * magnitude], dim=-1)

    def _dynamic_cos_sin(self, positions: torch.Tensor) -> torch.Tensor:
        """NTK-scaled angles of ``positions``: the base grows with the step's longest
        sequence ``s`` beyond the original context ``m``, by
        ``((factor * s / m) - (factor - 1)) ** (d / (d - 2))`` (transformers' rule)."""
        assert self.scaling is not None
        original = self.scaling.original_max_position
        factor, dim = self.scaling.factor, self.head_size
        length = torch.clamp(positions.max() + 1, min=original)
        base = self.base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float()
        inv_freq = 1.0 / (base ** (exponents / dim))
        angles = positions.float()[:, None] * inv_freq
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
        if self.scaling is not None and self.scaling.length_dependent:
            table = self._dynamic_cos_sin(positions)
        else:
            table = self.cos_sin_cache[positions]
        cos, sin = table.chunk(2, dim=-1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, max_position={self.max_position}, base={self.base}, "
            f"scaling={self.scaling}"
        )
