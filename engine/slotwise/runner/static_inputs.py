"""Static input buffers: the fixed addresses every captured graph reads from.

A replay reads the addresses seen at capture, so callers' tensors are copied into
buffers allocated once at the largest size; the view for a smaller size starts at
the same address, so every captured size shares them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


class StaticInputBuffers:
    def __init__(
        self,
        max_size: int,
        specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
        device: torch.device | str,
    ) -> None:
        """``specs`` maps each input name to (shape after the size dim, dtype)."""
        self.max_size = max_size
        self.buffers = {
            name: torch.zeros((max_size, *shape), dtype=dtype, device=device)
            for name, (shape, dtype) in specs.items()
        }

    def fill(self, padded_size: int, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Copy ``inputs`` into the buffers and return views of ``padded_size`` rows.

        Padding rows (past an input's own length) are zeroed: they are computed and
        sliced away, but a step-wide reduction over them (dynamic rope scaling takes the
        step's largest position) must not see what an earlier, larger step left there.
        """
        if padded_size > self.max_size:
            raise ValueError(
                f"size {padded_size} exceeds the static buffers' size {self.max_size}; "
                "sizes above the largest capture size run without graphs"
            )
        views = {}
        for name, value in inputs.items():
            buffer = self.buffers[name]
            buffer[: value.shape[0]].copy_(value)
            buffer[value.shape[0] : padded_size].zero_()
            views[name] = buffer[:padded_size]
        return views
