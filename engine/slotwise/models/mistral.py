"""Mistral: the Llama architecture; its sliding window is handled by ``HFConfig``."""

from __future__ import annotations

from slotwise.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    """transformers' ``MistralForCausalLM``: Llama's layers and tensor names.

    Its config's ``sliding_window`` caps the request length (see
    ``HFConfig.max_position``) instead of changing the attention.
    """
