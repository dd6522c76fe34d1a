"""Model building blocks that are CustomOps: each platform may run its own kernel.

Importing the package defines every core op, so replacements can be registered
for any of them by name.
"""

from slotwise.layers.activation import SiluAndMul
from slotwise.layers.layernorm import RMSNorm
from slotwise.layers.logits import LogitsHead
from slotwise.layers.rotary_embedding import RotaryEmbedding

__all__ = ["LogitsHead", "RMSNorm", "RotaryEmbedding", "SiluAndMul"]
