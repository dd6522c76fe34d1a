"""``LlamaConfig``: the shape of a Llama-family model, as the model and the config
validation of a Hugging Face checkpoint (hf_config.py) both need it."""

from __future__ import annotations

from dataclasses import dataclass

from slotwise.layers.rotary_embedding import RopeScaling


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama-family model; names are slotwise's (``num_layers`` for
    transformers' ``num_hidden_layers``, ``max_position`` for ``max_position_embeddings``)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position: int = 2048
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    #: The size of each head; None: hidden_size / num_heads.
    head_dim: int | None = None
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    #: RMSNorm over each query and key head before the rotation (Qwen3).
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    block_size: int = 16

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads if self.head_dim is None else self.head_dim
