"""LLMEngine.from_checkpoint on a checkpoint folder transformers saved: text prompts in,
transformers' greedy tokens out, with the folder's name and end ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from serving_support import byte_tokenizer

from slotwise.compilation import CompilationConfig, counters
from slotwise_engine.serving.engine import LLMEngine
from slotwise_engine.serving.request_params import RequestParams


def tiny_llama_checkpoint(tmp_path: Path) -> tuple[Path, Any, Any]:
    """A two-layer Llama saved by transformers with a byte tokenizer: the folder, the
    transformers model and the tokenizer."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.3, eos_token_id=255,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path / "tiny-llama"
    oracle = transformers.LlamaForCausalLM(config).eval()
    oracle.save_pretrained(folder)
    tokenizer = byte_tokenizer()
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    return folder, oracle, tokenizer


@pytest.mark.slow
def test_an_engine_from_a_checkpoint_folder_generates_what_transformers_does(tmp_path):
    folder, oracle, tokenizer = tiny_llama_checkpoint(tmp_path)
    engine = LLMEngine.from_checkpoint(
        folder, compilation=CompilationConfig(level=0), num_kv_blocks=8, max_num_seqs=4
    )
    assert engine.model_name == "tiny-llama" and engine.eos_token_ids == {255}
    assert engine.max_model_len == 8 * 16 and engine.stats().kv_blocks_total == 8
    prompts = {"a": "Hello world", "b": "Grüße"}
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, RequestParams(max_tokens=10, ignore_eos=True))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    results = {o.request_id: o for o in outputs if o.finished}
    for request_id, prompt in prompts.items():
        ids = tokenizer.encode(prompt)
        expected = oracle.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=10, min_new_tokens=10
        )[0, len(ids) :].tolist()
        assert results[request_id].token_ids == expected
        assert results[request_id].text == tokenizer.decode(expected)


@pytest.mark.slow
def test_a_compiled_engine_compiles_before_its_first_request(tmp_path):
    folder, _, _ = tiny_llama_checkpoint(tmp_path)
    params = RequestParams(max_tokens=6, ignore_eos=True)
    prompts = {"a": [1, 2, 3], "b": [40, 41, 42, 43, 44, 45, 46, 47, 48], "c": [7]}

    def tokens(engine: LLMEngine) -> dict[str, list[int]]:
        for request_id, prompt in prompts.items():
            engine.add_request(request_id, prompt, params)
        outputs = []
        while engine.has_unfinished():
            outputs += engine.step()
        return {o.request_id: o.token_ids for o in outputs if o.finished}

    eager = tokens(LLMEngine.from_checkpoint(folder, compilation=CompilationConfig(level=0)))
    level3 = CompilationConfig(level=3, backend="eager", cache_dir=str(tmp_path / "cache"))
    before = counters.num_backend_compilations
    engine = LLMEngine.from_checkpoint(folder, compilation=level3)
    compiled = counters.num_backend_compilations
    assert compiled > before  # at build, not in the first request's step
    assert tokens(engine) == eager
    assert counters.num_backend_compilations == compiled  # no step compiled anything
