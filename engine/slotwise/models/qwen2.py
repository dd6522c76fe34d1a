"""Qwen2: the Llama architecture with biases on the query, key and value projections."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from slotwise.models.llama import LlamaConfig, LlamaForCausalLM

if TYPE_CHECKING:
    from slotwise.models.hf_config import HFConfig


class Qwen2ForCausalLM(LlamaForCausalLM):
    """transformers' ``Qwen2ForCausalLM``: q/k/v always have a bias, the output
    projection and the MLP never do (its config has no bias fields)."""

    @classmethod
    def config_from_hf(cls, hf: HFConfig) -> LlamaConfig:
        config = super().config_from_hf(hf)
        return replace(config, qkv_bias=True, o_proj_bias=False, mlp_bias=False)
