"""Qwen3: the Llama architecture with an RMSNorm over each query and key head."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from slotwise.models.llama import LlamaConfig, LlamaForCausalLM

if TYPE_CHECKING:
    from slotwise.models.hf_config import HFConfig


class Qwen3ForCausalLM(LlamaForCausalLM):
    """transformers' ``Qwen3ForCausalLM``: ``q_norm``/``k_norm`` normalise each head
    before the rotation; ``head_dim`` is set on its own (128 where hidden_size /
    num_attention_heads is 64 or 80); ``attention_bias`` covers q, k, v and o, and
    the MLP has no bias."""

    @classmethod
    def config_from_hf(cls, hf: HFConfig) -> LlamaConfig:
        return replace(super().config_from_hf(hf), qk_norm=True, mlp_bias=False)
