"""Pairs of config.json keys that overlap (``rope_scaling`` and ``rope_parameters``,
``rope_theta`` or ``original_max_position_embeddings`` inside and outside them,
``head_dim`` and hidden_size / heads, the sliding-window keys,
``tie_word_embeddings`` and a stored ``lm_head.weight``, ...), each value valid on its
own: slotwise loads such a config exactly when transformers runs it on the weights
the checkpoint holds, and then generates transformers' greedy tokens.

Each case's weights are drawn by transformers from its own reading of the case's
config.json, which is then written back raw (``save_pretrained`` would normalise the
overlap away), so a key slotwise reads otherwise shows up as a tensor of the wrong
shape or as different tokens.  The known conflicts are listed; a seeded draw adds
pairs nobody listed.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_checkpoints import SMALL, run_steps
from safetensors.torch import load_file, save_file

from slotwise_engine.models import CheckpointError, load_model
from slotwise_engine.models.hf_config import HFConfig
from slotwise_engine.models.registry import model_class
from slotwise_engine.runner.model_runner import ModelRunner

transformers = pytest.importorskip("transformers")

PROMPT = [5, 17, 42, 99, 7, 250, 3, 64, 11, 180, 23, 141]
NEW_TOKENS = 6
#: A window shorter than PROMPT, and one longer than the context (256).
SHORT_WINDOW, LONG_WINDOW = 4, 1000
#: A pseudo key: what the checkpoint stores besides what save_pretrained writes.
STORED_HEAD = "stored lm_head.weight"
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
LLAMA3_16 = {
    "rope_type": "llama3",
    "rope_theta": 50000.0,
    **LLAMA3,
    "original_max_position_embeddings": 16,
}
YARN_16 = {
    "rope_type": "yarn",
    "rope_theta": 3000.0,
    "factor": 2.0,
    "original_max_position_embeddings": 16,
}
FAMILIES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

#: (model_type, keys over the base config): the conflicts transformers resolves its way.
LISTED: list[tuple[str, dict[str, Any]]] = [
    # rope_scaling replaces rope_parameters whole: its theta, else the top-level one
    (
        "llama",
        {
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
            "rope_scaling": {"type": "linear", "factor": 4.0},
        },
    ),
    (
        "qwen2",
        {
            "rope_parameters": {"rope_type": "linear", "factor": 2.0},
            "rope_scaling": {"type": "linear", "factor": 4.0},
            "rope_theta": 1e6,
        },
    ),
    ("qwen3", {"rope_parameters": LLAMA3_16, "rope_scaling": YARN_16}),
    ("mistral", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}, "rope_scaling": {}}),
    # rope_theta inside the RoPE object wins; rope_type wins over type
    (
        "mistral",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 77.0}, "rope_theta": 1e6},
    ),
    ("llama", {"rope_parameters": {"type": "linear", "rope_type": "default", "factor": 3.0}}),
    # a top-level original_max_position_embeddings wins (llama3, yarn), and only there
    ("llama", {"rope_parameters": LLAMA3_16, "original_max_position_embeddings": 64}),
    ("qwen2", {"rope_scaling": YARN_16, "original_max_position_embeddings": 128}),
    (
        "llama",
        {
            "rope_parameters": {"rope_type": "linear", "factor": 2.0},
            "original_max_position_embeddings": 8,
        },
    ),
    # head_dim against hidden_size / heads, and the family defaults
    ("qwen3", {"head_dim": None}),  # Qwen3Config: 128
    ("llama", {"head_dim": 32}),
    ("mistral", {"num_attention_heads": 8, "num_key_value_heads": None}),  # MistralConfig: 8
    ("qwen2", {"num_key_value_heads": None}),  # Qwen2Config: 32, not a divisor of 4 heads
    # bias keys a family's model ignores
    ("mistral", {"attention_bias": True, "mlp_bias": True}),
    ("qwen2", {"attention_bias": True}),
    # tie_word_embeddings against the stored tensors
    ("llama", {"tie_word_embeddings": True, STORED_HEAD: "different"}),
    ("qwen3", {"tie_word_embeddings": True, STORED_HEAD: "equal"}),
    ("qwen2", {"tie_word_embeddings": True, STORED_HEAD: "instead of the embeddings"}),
    ("mistral", {"tie_word_embeddings": False, STORED_HEAD: "instead of the embeddings"}),
    # sliding windows: per family, and the transformers KV cache's for Llama
    ("llama", {"sliding_window": SHORT_WINDOW}),
    ("llama", {"sliding_window": SHORT_WINDOW, "layer_types": ["full_attention"] * 2}),
    ("mistral", {"sliding_window": SHORT_WINDOW, "use_sliding_window": False}),
    (
        "mistral",
        {"head_dim": 16, "sliding_window": SHORT_WINDOW, "layer_types": ["full_attention"] * 2},
    ),
    ("mistral", {"layer_types": ["sliding_attention"] * 2}),  # Ministral's, without head_dim
    ("qwen2", {"sliding_window": SHORT_WINDOW, "use_sliding_window": True, "max_window_layers": 1}),
    (
        "qwen3",
        {"sliding_window": SHORT_WINDOW, "layer_types": ["full_attention", "sliding_attention"]},
    ),
]

#: Values of each key for the seeded draw, each one valid on its own; a draw picks two
#: or three keys of one group.
GROUPS: list[dict[str, list[Any]]] = [
    {
        "rope_parameters": [
            {"rope_type": "default", "rope_theta": 5e5},
            {"rope_type": "linear", "factor": 2.0},
            LLAMA3_16,
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        ],
        "rope_scaling": [{}, {"type": "linear", "factor": 4.0}, YARN_16],
        "rope_theta": [1000.0, 1e6],
        "original_max_position_embeddings": [8, 64],
    },
    {
        "head_dim": [None, 8, 32],
        "num_key_value_heads": [None, 1, 4],
        "attention_bias": [True, False],
        "mlp_bias": [True, False],
    },
    {
        "tie_word_embeddings": [True, False],
        STORED_HEAD: ["different", "equal", "instead of the embeddings"],
    },
    {
        "sliding_window": [None, SHORT_WINDOW, LONG_WINDOW],
        "use_sliding_window": [True, False],
        "max_window_layers": [0, 1],
        "layer_types": [["full_attention", "sliding_attention"], ["full_attention"] * 2],
        "head_dim": [None, 16],
    },
]
DRAWN = 6


def drawn() -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(49)
    out = []
    for _ in range(DRAWN):
        group = rng.choice(GROUPS)
        keys = rng.sample(sorted(group), min(len(group), rng.choice([2, 3])))
        out.append((rng.choice(sorted(FAMILIES)), {key: rng.choice(group[key]) for key in keys}))
    return out


def base_config(model_type: str) -> dict[str, Any]:
    """hf_checkpoints' tiny shapes, with the keys whose absence the families read
    differently (num_key_value_heads: 8 or 32) set."""
    return {
        **SMALL,
        "architectures": [FAMILIES[model_type]],
        "model_type": model_type,
        "num_key_value_heads": 2,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def write_case(folder: Path, model_type: str, keys: dict[str, Any]) -> str | None:
    """A checkpoint of transformers' reading of the case's config.json, with that
    config.json written back raw (a key set to None is left out); or, where
    transformers cannot build that model, just the config.json and why."""
    raw = base_config(model_type)
    raw.update({k: v for k, v in keys.items() if k != STORED_HEAD})
    raw = {k: v for k, v in raw.items() if v is not None or k == "sliding_window"}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    try:
        config = transformers.AutoConfig.from_pretrained(folder)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 - a config transformers cannot build
        return f"transformers fails: {exc!r}"
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(raw))
    stored = keys.get(STORED_HEAD)
    if stored is not None:
        path = folder / "model.safetensors"
        tensors = load_file(path)
        embeddings = tensors["model.embed_tokens.weight"]
        tensors["lm_head.weight"] = {
            "different": lambda: torch.randn_like(embeddings) * 0.3,
            "equal": embeddings.clone,
            "instead of the embeddings": lambda: tensors.pop("model.embed_tokens.weight"),
        }[stored]()
        save_file(tensors, path, metadata={"format": "pt"})
    return None


def transformers_tokens(folder: Path) -> list[int] | str:
    """transformers' greedy continuation of PROMPT, or why it has none: it fails, or it
    runs on weights it drew itself because the checkpoint lacks them."""
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, output_loading_info=True
        )
        if info["missing_keys"]:
            return f"transformers draws the missing {sorted(info['missing_keys'])}"
        with torch.no_grad():
            out = model.eval().generate(
                torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
            )
    except Exception as exc:  # noqa: BLE001 - a config transformers cannot run
        return f"transformers fails: {exc!r}"
    return out[0, len(PROMPT) :].tolist()


def without_windows(folder: Path) -> None:
    """Rewrite ``folder``'s config.json with no sliding window anywhere."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key in ("use_sliding_window", "max_window_layers", "layer_types"):
        config.pop(key, None)
    path.write_text(json.dumps({**config, "sliding_window": None}))


@pytest.fixture(autouse=True)
def quiet():
    """The cases warn by design (overlapping keys, untied heads, windows)."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    logging.getLogger("slotwise").setLevel(logging.ERROR)
    yield
    logging.getLogger("slotwise").setLevel(logging.NOTSET)
    transformers.logging.set_verbosity(verbosity)


CASES = LISTED + drawn()


@pytest.mark.parametrize(
    "model_type, keys", CASES, ids=[f"{t}:{'+'.join(keys)}" for t, keys in CASES]
)
def test_overlapping_keys_are_read_as_transformers_reads_them(model_type, keys, tmp_path):
    folder = tmp_path / "case"
    unbuildable = write_case(folder, model_type, keys)
    expected = unbuildable or transformers_tokens(folder)
    try:
        hf = HFConfig.read(folder)
        model_class(hf).config_from_hf(hf)
        assert unbuildable is None, "slotwise reads a config transformers cannot build"
        model = load_model(folder, dtype=torch.float32, compilation_config={"level": 0})
    except CheckpointError as exc:
        assert "\n" not in str(exc) and "config.json" in str(exc), exc
        assert isinstance(expected, str), f"refused, though transformers runs it: {exc}"
        return
    assert not isinstance(expected, str), expected
    if model.config.max_position < len(PROMPT) + NEW_TOKENS:
        # slotwise serves only requests within the window, and transformers applies it
        assert model.config.max_position == SHORT_WINDOW
        without_windows(folder)
        assert transformers_tokens(folder) != expected
        return
    _, tokens = run_steps(ModelRunner(model, num_blocks=4), [PROMPT], NEW_TOKENS - 1)
    assert tokens[0][len(PROMPT) :][: len(expected)] == expected[: NEW_TOKENS - 1]


@pytest.mark.parametrize("stored, tied", [("different", False), ("equal", True)])
def test_a_stored_lm_head_unties_the_embeddings_only_where_it_differs(
    stored, tied, tmp_path, caplog
):
    folder = tmp_path / "case"
    write_case(folder, "llama", {"tie_word_embeddings": True, STORED_HEAD: stored})
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        model = load_model(folder, compilation_config={"level": 0})
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert model.config.tie_word_embeddings == tied
    torch.testing.assert_close(
        model.lm_head.weight, load_file(folder / "model.safetensors")["lm_head.weight"]
    )
    warnings = [r.getMessage() for r in caplog.records if "lm_head.weight" in r.getMessage()]
    assert len(warnings) == (0 if tied else 1)
