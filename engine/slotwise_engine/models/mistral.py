"""Mistral: the Llama architecture; its sliding window is handled by ``HFConfig``."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from slotwise_engine.models.hf_config import FamilyRules, HFConfig
from slotwise_engine.models.llama import LlamaConfig, LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    """transformers' ``MistralForCausalLM``: Llama's layers and tensor names, without
    any bias (its model ignores ``attention_bias`` and ``mlp_bias``).

    Its config's ``sliding_window`` (4096 where absent, none where null) covers every
    layer and caps the request length (see ``HFConfig.max_position``) instead of
    changing the attention.  A config with ``layer_types`` transformers reads as
    Ministral's (the same model, its layers sliding as ``layer_types`` says), which
    needs ``head_dim``.
    """

    family_rules: ClassVar[FamilyRules] = FamilyRules(num_kv_heads=8, sliding_window="every_layer")

    @classmethod
    def config_from_hf(cls, hf: HFConfig) -> LlamaConfig:
        if "layer_types" in hf.data and hf.get("head_dim") is None:
            raise hf.error(
                "layer_types makes transformers read this Mistral config as Ministral's, whose "
                "model needs head_dim (it fails without); set head_dim, or remove layer_types"
            )
        config = super().config_from_hf(hf)
        return replace(config, qkv_bias=False, o_proj_bias=False, mlp_bias=False)
