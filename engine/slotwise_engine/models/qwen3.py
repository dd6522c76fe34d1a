"""Qwen3: the Llama architecture with an RMSNorm over each query and key head."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from slotwise_engine.models.hf_config import FamilyRules, HFConfig
from slotwise_engine.models.llama import LlamaConfig, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """transformers' ``Qwen3ForCausalLM``: ``q_norm``/``k_norm`` normalise each head
    before the rotation; ``head_dim`` is set on its own (128 where config.json has
    none, as in Qwen3Config); ``attention_bias`` covers q, k, v and o, and the MLP has
    no bias."""

    family_rules: ClassVar[FamilyRules] = FamilyRules(
        num_kv_heads=32, head_dim=128, sliding_window="per_layer"
    )

    @classmethod
    def config_from_hf(cls, hf: HFConfig) -> LlamaConfig:
        return replace(super().config_from_hf(hf), qk_norm=True, mlp_bias=False)
