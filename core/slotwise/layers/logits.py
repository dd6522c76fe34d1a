"""``LogitsHead``: the LM head's product for the rows a step asks logits of.

Why a CustomOp: at batch 1 the LM head is a one-row product over the largest weight of
a small model, and it runs after the compiled model, so no compiled piece can hand it
to a platform's kernel.  As a CustomOp a plugin replaces it without model changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from slotwise.custom_op import CustomOp

if TYPE_CHECKING:
    from slotwise.distributed.parallel_layers import ParallelLMHead


class LogitsHead(CustomOp):
    """``lm_head(hidden)`` in float32: ``[rows, hidden_size]`` -> ``[rows, vocab_size]``.

    A plugin replacement is ``fn(layer, lm_head, hidden)``.
    """

    op_name = "logits"
    inside_compiled_graphs = False

    def forward_native(self, lm_head: ParallelLMHead, hidden: torch.Tensor) -> torch.Tensor:
        return lm_head(hidden).float()
