"""Qwen2: the Llama architecture with biases on the query, key and value projections."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from slotwise_engine.models.hf_config import FamilyRules, HFConfig
from slotwise_engine.models.llama import LlamaConfig, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """transformers' ``Qwen2ForCausalLM``: q/k/v always have a bias, the output
    projection and the MLP never do (its config has no bias fields)."""

    family_rules: ClassVar[FamilyRules] = FamilyRules(num_kv_heads=32, sliding_window="per_layer")

    @classmethod
    def config_from_hf(cls, hf: HFConfig) -> LlamaConfig:
        config = super().config_from_hf(hf)
        return replace(config, qkv_bias=True, o_proj_bias=False, mlp_bias=False)
