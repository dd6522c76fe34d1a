"""A Llama-architecture decoder built from slotwise layers.

Embedding, RMSNorm, rotary embedding, grouped-query attention through the
``Attention`` layer (the split point of piecewise compilation), a SwiGLU MLP and
an LM head.  Weights are seeded random numbers: the model exists to exercise and
measure the framework, not to produce text.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from slotwise.attention.layer import Attention
from slotwise.compilation.decorators import support_torch_compile
from slotwise.distributed.parallel_layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from slotwise.layers.activation import SiluAndMul
from slotwise.layers.layernorm import RMSNorm
from slotwise.layers.rotary_embedding import RotaryEmbedding


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    block_size: int = 16

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads


PRESETS: dict[str, LlamaConfig] = {
    # For tests: compiles in seconds.
    "tiny": LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position=512,
    ),
    # About 30M parameters: the CPU benchmark model.
    "small": LlamaConfig(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1376,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
    ),
    # Llama-3.2-1B's shapes (1.24B parameters); the rotary table is cut to 8192 positions.
    "llama-3.2-1b": LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        max_position=8192,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
}

_instance_numbers = itertools.count()


class LlamaAttention(nn.Module):
    """Grouped-query attention; under tensor parallelism each rank holds a share of the
    heads (QKV split by head, output projection all-reduced)."""

    def __init__(self, config: LlamaConfig, prefix: str) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, config.head_size, config.num_heads, config.num_kv_heads
        )
        self.o_proj = RowParallelLinear(
            config.num_heads * config.head_size, config.hidden_size, bias=False
        )
        self.rotary_emb = RotaryEmbedding(
            config.head_size, config.max_position, base=config.rope_theta
        )
        self.attn = Attention(
            self.qkv_proj.num_heads,
            config.head_size,
            config.head_size**-0.5,
            self.qkv_proj.num_kv_heads,
            prefix=f"{prefix}.attn",
            block_size=config.block_size,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj
        q, k, v = qkv(hidden).split([qkv.q_size, qkv.kv_size, qkv.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=False
        )
        self.act = SiluAndMul()
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, prefix: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, prefix=f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": 0})
class LlamaModel(nn.Module):
    """The decoder stack; compiled as one graph, split at every attention layer."""

    def __init__(self, config: LlamaConfig, prefix: str) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, prefix=f"{prefix}.layers.{i}")
            for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """``forward`` returns hidden states; ``compute_logits`` projects the rows asked for,
    so a decode step never pays for the logits of padding or prompt tokens."""

    def __init__(self, config: LlamaConfig, *, prefix: str | None = None) -> None:
        super().__init__()
        self.config = config
        # Attention layers are found by name, so each live model needs its own prefix.
        prefix = prefix or f"llama{next(_instance_numbers)}"
        self.model = LlamaModel(config, prefix=prefix)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build_llama(
    preset: str | LlamaConfig,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    compilation_config: object = None,
    prefix: str | None = None,
) -> LlamaForCausalLM:
    """A model of ``preset`` with weights drawn from ``seed`` (normal, std 0.02)."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    from slotwise.compilation.config import CompilationConfig
    from slotwise.compilation.context import get_current_compilation_config, set_compilation_config

    config = (
        get_current_compilation_config()
        if compilation_config is None
        else CompilationConfig.coerce(compilation_config)
    )
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with set_compilation_config(config), torch.device(device):
            model = LlamaForCausalLM(preset, prefix=prefix)
    finally:
        torch.set_default_dtype(previous_dtype)
    _draw_weights(model, seed)
    return model.eval().requires_grad_(False)  # an inference model: no autograd state


def _draw_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Normal(0, 0.02) weights from ``seed``, drawn unsharded and then sharded, so every
    tensor-parallel size holds the same model; RMSNorm weights stay 1."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, module in model.named_modules():
            if not hasattr(module, "load_full_weight") or (tied and name == "lm_head"):
                continue
            shape = (
                (module.num_embeddings, module.embedding_dim)
                if isinstance(module, VocabParallelEmbedding)
                else (module.output_size, module.input_size)
            )
            weight = torch.randn(shape, generator=generator) * 0.02
            module.load_full_weight(weight.to(module.weight.dtype))
