"""The architectures ``load_model`` can build, keyed by config.json's ``architectures``.

Adding one: a module defining a ``LlamaForCausalLM`` subclass named like the
architecture (its ``config_from_hf`` maps the config), and its line here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slotwise_engine.models.hf_config import HFConfig
    from slotwise_engine.models.llama import LlamaForCausalLM

#: Architecture name -> the module defining the class of that name.
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "slotwise_engine.models.llama",
    "MistralForCausalLM": "slotwise_engine.models.mistral",
    "Qwen2ForCausalLM": "slotwise_engine.models.qwen2",
    "Qwen3ForCausalLM": "slotwise_engine.models.qwen3",
}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def model_class(hf: HFConfig) -> type[LlamaForCausalLM]:
    """The class of the first of the config's architectures that slotwise implements."""
    names = hf.architectures()
    for name in names:
        if name in ARCHITECTURES:
            return getattr(importlib.import_module(ARCHITECTURES[name]), name)
    raise hf.error(
        f"architecture {', '.join(names)} is not supported; slotwise loads "
        f"{', '.join(supported_architectures())}"
    )
