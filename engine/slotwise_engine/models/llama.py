"""A Llama-architecture decoder built from slotwise layers.

Embedding, RMSNorm, rotary embedding, grouped-query attention through the
``Attention`` layer (the split point of piecewise compilation), a SwiGLU MLP and
an LM head.  ``LlamaConfig`` switches on what the Llama family's relatives add
(biases, per-head q/k norms, an explicit head size, RoPE scaling), so Mistral and
Qwen are small subclasses.  Two ways to get weights, one construction: ``build_llama``
draws seeded random ones for a preset (to exercise and measure the framework),
``slotwise_engine.models.load_model`` reads a Hugging Face checkpoint.  Both build the
model on the meta device first, so no weight is drawn only to be overwritten.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from slotwise.attention.layer import Attention, unused_layer_prefix
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
from slotwise.layers.logits import LogitsHead
from slotwise.layers.rotary_embedding import RotaryEmbedding
from slotwise.platforms import get_current_platform
from slotwise_engine.models.hf_config import FamilyRules, HFConfig, llama_config
from slotwise_engine.models.llama_config import LlamaConfig

if TYPE_CHECKING:
    from typing_extensions import Self


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
        rms_norm_eps=1e-5,
    ),
    # About 30M parameters: the CPU benchmark model.
    "small": LlamaConfig(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1376,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        rms_norm_eps=1e-5,
    ),
    # Llama-3.2-1B's shapes (1.24B parameters); the rotary table is cut to 8192 positions.
    "1b": LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        max_position=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}


class LlamaAttention(nn.Module):
    """Grouped-query attention; under tensor parallelism each rank holds a share of the
    heads (QKV split by head, output projection all-reduced)."""

    def __init__(self, config: LlamaConfig, rotary_emb: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        head_size = config.head_size
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            head_size,
            config.num_heads,
            config.num_kv_heads,
            bias=config.qkv_bias,
        )
        self.o_proj = RowParallelLinear(
            config.num_heads * head_size, config.hidden_size, bias=config.o_proj_bias
        )
        self.q_norm = RMSNorm(head_size, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(head_size, config.rms_norm_eps) if config.qk_norm else None
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            self.qkv_proj.num_heads,
            head_size,
            head_size**-0.5,
            self.qkv_proj.num_kv_heads,
            prefix=f"{prefix}.attn",
            block_size=config.block_size,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj
        q, k, v = qkv(hidden).split([qkv.q_size, qkv.kv_size, qkv.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = _norm_heads(self.q_norm, q), _norm_heads(self.k_norm, k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


def _norm_heads(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm`` over each head of ``x`` [num_tokens, heads * head_size]."""
    return norm(x.unflatten(-1, (-1, norm.weight.shape[0]))).flatten(-2)


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=config.mlp_bias
        )
        self.act = SiluAndMul()
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=config.mlp_bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, rotary_emb: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary_emb, prefix=f"{prefix}.self_attn")
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
    """The decoder stack; compiled as one graph, split at every attention layer.

    One rotary table serves every layer: at 128k positions it is tens of megabytes.
    """

    def __init__(self, config: LlamaConfig, prefix: str) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(
            config.head_size, config.max_position, config.rope_theta, scaling=config.rope_scaling
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, self.rotary_emb, prefix=f"{prefix}.layers.{i}")
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
    so a decode step never pays for the logits of padding or prompt tokens.

    Parameter names are the checkpoint's, except the fused projections in
    ``fused_modules``; ``config_from_hf`` reads a checkpoint's config.json.
    """

    #: Fused module -> the checkpoint modules it stacks, in its order.
    fused_modules: ClassVar[dict[str, tuple[str, ...]]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }
    #: With ``tie_word_embeddings``: the LM head's tensor and the embedding's it shares.
    tied_tensors: ClassVar[tuple[str, str]] = ("lm_head.weight", "model.embed_tokens.weight")
    #: How the family's transformers config class reads config.json (Llama: as is).
    family_rules: ClassVar[FamilyRules] = FamilyRules()

    def __init__(self, config: LlamaConfig, *, prefix: str | None = None) -> None:
        super().__init__()
        self.config = config
        # Attention layers are found by name, so each live model needs its own prefix.
        prefix = prefix or unused_layer_prefix("llama")
        self.model = LlamaModel(config, prefix=prefix)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_head = LogitsHead()
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits_head(self.lm_head, hidden)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def config_from_hf(cls, hf: HFConfig) -> LlamaConfig:
        """The config of transformers' ``LlamaForCausalLM``, checked whole by
        ``llama_config`` under the class's ``family_rules``; subclasses adjust it."""
        return llama_config(hf, cls.family_rules)

    def is_redundant_tensor(self, name: str) -> bool:
        """Checkpoint tensors the model derives rather than loads: rotary tables some
        exports include, and the LM head of tied embeddings."""
        tied = self.config.tie_word_embeddings and name == self.tied_tensors[0]
        return tied or name.endswith("rotary_emb.inv_freq")

    @classmethod
    def empty(
        cls,
        config: LlamaConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        compilation_config: object = None,
        prefix: str | None = None,
    ) -> Self:
        """The model with uninitialised weights in ``dtype`` on ``device`` (default: the
        current platform's): built on the meta device, then given memory, so nothing is
        drawn that loading overwrites."""
        model = cls.on_meta(
            config, dtype=dtype, compilation_config=compilation_config, prefix=prefix
        )
        return model.materialize(device or get_current_platform().device_type)

    @classmethod
    def on_meta(
        cls,
        config: LlamaConfig,
        *,
        dtype: torch.dtype = torch.float32,
        compilation_config: object = None,
        prefix: str | None = None,
    ) -> Self:
        """The model on the meta device: every shape, no memory, so a checkpoint can be
        checked against it before anything is allocated."""
        from slotwise.compilation.config import CompilationConfig
        from slotwise.compilation.context import (
            get_current_compilation_config,
            set_compilation_config,
        )

        compilation = (
            get_current_compilation_config()
            if compilation_config is None
            else CompilationConfig.coerce(compilation_config)
        )
        with set_compilation_config(compilation), torch.device("meta"), _default_dtype(dtype):
            return cls(config, prefix=prefix)

    def materialize(self, device: torch.device | str) -> Self:
        """This meta model given (uninitialised) memory on ``device``, rotary tables filled."""
        # to_empty's empty_like on meta tensors runs torch's Python reference kernels,
        # whose first use imports sympy (0.4 s of start-up); a plain empty does not.
        self._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
        self.tie_weights()  # each module was given its own new parameter
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, RotaryEmbedding):
                    module.cos_sin_cache.copy_(module.compute_cos_sin_cache())
        return self.eval().requires_grad_(False)  # an inference model: no autograd state


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_llama(
    preset: str | LlamaConfig,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    compilation_config: object = None,
    prefix: str | None = None,
) -> LlamaForCausalLM:
    """A model of ``preset`` with weights drawn from ``seed`` (normal, std 0.02) on
    ``device`` (default: the current platform's, where ``ModelRunner`` runs it)."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    model = LlamaForCausalLM.empty(
        preset, dtype=dtype, device=device, compilation_config=compilation_config, prefix=prefix
    )
    _draw_weights(model, seed)
    return model


@torch.no_grad()
def _draw_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Normal(0, 0.02) weights from ``seed``, drawn unsharded and then sharded, so every
    tensor-parallel size holds the same model; norm weights 1, biases 0."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.weight.fill_(1.0)
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor):
            bias.zero_()
    tied = model.config.tie_word_embeddings
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
