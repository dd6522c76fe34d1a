"""Small models with attention-like split points, for tests, examples and plugin CI.

``toy_attention`` stands in for real attention: an opaque custom op that writes its
result into a preallocated ``out`` buffer, so graphs split at it exactly as they
split at ``slotwise::unified_attention_with_output``.
"""

from __future__ import annotations

import torch
from torch import nn

from slotwise.compilation.decorators import support_torch_compile

#: Pass as ``splitting_ops`` to split these models.
TOY_SPLITTING_OPS = ["slotwise_toy::attention"]


@torch.library.custom_op("slotwise_toy::attention", mutates_args=("out",))
def toy_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor
) -> None:
    """A cheap, shape-preserving stand-in: out = query * sigmoid(key) + value."""
    out.copy_(query * torch.sigmoid(key) + value)


@toy_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor) -> None:
    return None


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(query)
    torch.ops.slotwise_toy.attention(query, key, value, out)
    return out


@support_torch_compile
class SillyModel(nn.Module):
    """Two split points: 5 pieces, 3 of them capturable."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.proj_in = nn.Linear(hidden, hidden)
        self.proj_mid = nn.Linear(hidden, hidden)
        self.proj_out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.proj_in(x)) + 1
        x = attend(x, x, x)
        x = self.proj_mid(x) * 2
        x = attend(x, x, x)
        return self.proj_out(x) - 1


class ToyLayer(nn.Module):
    """Pre-norm block: attention-like mixing around the split op, then an MLP."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        x = x + self.out(attend(q.contiguous(), k.contiguous(), v.contiguous()))
        return x + self.mlp(x)


@support_torch_compile
class ToyTransformer(nn.Module):
    """``num_layers`` split points: 2L+1 pieces, L+1 capturable, the middle ones alike."""

    def __init__(self, num_layers: int = 2, hidden: int = 16, vocab: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(ToyLayer(hidden) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))
