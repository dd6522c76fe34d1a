"""Every config.json key of each architecture, perturbed: each case ends in one
CheckpointError naming config.json, or in a model whose greedy tokens are
transformers' own.  Most cases fail validation without building anything; of the
ones that load, each distinct resulting config is compared with transformers once."""

from __future__ import annotations

import copy
import json
import math
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hf_checkpoints import make_checkpoint, reference_greedy, run_steps

from slotwise_engine.models import CheckpointError, load_model
from slotwise_engine.models.hf_config import HFConfig
from slotwise_engine.models.registry import model_class
from slotwise_engine.runner.model_runner import ModelRunner

pytest.importorskip("transformers")

ARCHITECTURES = ["llama", "mistral", "qwen2", "qwen3"]
MISSING = object()
#: Keys some configs carry and the pristine ones may not.
EXTRA_KEYS = [
    "head_dim",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "rope_theta",
    "rope_scaling",
    "partial_rotary_factor",
    "quantization_config",
    "torch_dtype",
]
ROPE_KEYS = [
    "rope_type",
    "rope_theta",
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "attention_factor",
]
PROMPT = [5, 17, 42, 99, 7, 250, 3, 64]
NEW_TOKENS = 6
#: Distinct accepted configs loaded, and of those compared with transformers, per
#: architecture (CI time).
LOADED, COMPARED = 5, 2


def perturbations(value: Any) -> list[Any]:
    """Values a user or an attacker might leave in a field holding ``value``."""
    values: list[Any] = [
        MISSING,
        None,
        "x",
        "16",
        [1],
        {"a": 1},
        [[[[1]]]],
        True,
        False,
        0,
        -1,
        1,
        2,
        3,
        7,
        2**62,
        -(2**62),
        10**30,
        1e9,
        0.5,
        1.5,
        -0.5,
        math.nan,
        math.inf,
        -math.inf,
    ]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        values += [value * 2, value + 1, value - 1, value / 2, float(value)]
    return values


def cases(config: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for key in sorted(set(config) | set(EXTRA_KEYS)):
        for value in perturbations(config.get(key)):
            out.append(_with(config, key, value))
    rope = config.get("rope_parameters") or {}
    for rope_type in ["default", "linear", "dynamic", "yarn", "llama3", "longrope"]:
        for field in ROPE_KEYS:
            for value in perturbations(rope.get(field, 4.0)):
                params = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 2.0}
                if rope_type == "llama3":
                    params.update(low_freq_factor=1.0, high_freq_factor=4.0)
                out.append(_with(config, "rope_parameters", _with(params, field, value)))
    # Keys that disagree with each other or with the weights.
    for _ in range(150):
        changed = config
        for key in rng.sample(sorted(config), 2):
            changed = _with(changed, key, rng.choice(perturbations(config[key])))
        out.append(changed)
    return out


def _with(config: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(config)
    if value is MISSING:
        changed.pop(key, None)
    else:
        changed[key] = value
    return changed


@pytest.fixture(scope="module", params=ARCHITECTURES)
def pristine(request, tmp_path_factory) -> Path:
    return make_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def test_every_perturbed_config_fails_cleanly_or_matches_transformers(pristine, tmp_path):
    config = json.loads((pristine / "config.json").read_text())
    folder = tmp_path / "case"
    folder.mkdir()
    os.link(pristine / "model.safetensors", folder / "model.safetensors")
    all_cases = cases(config, random.Random(0))
    assert len(all_cases) > 700
    accepted: dict[Any, dict[str, Any]] = {}
    for case in all_cases:
        (folder / "config.json").write_text(json.dumps(case))
        try:  # load_model's own first steps: no model is built
            hf = HFConfig.read(folder)
            model_config = model_class(hf).config_from_hf(hf)
        except CheckpointError as exc:
            message = str(exc)
            assert "\n" not in message and "config.json" in message, (case, message)
            continue
        accepted.setdefault(model_config, case)
    pristine_config = load_model(pristine, compilation_config={"level": 0}).config
    assert pristine_config in accepted  # perturbations that change nothing load as before
    others = sorted((c for c in accepted if c != pristine_config), key=repr)
    sample = [pristine_config, *random.Random(1).sample(others, min(LOADED, len(others)))]
    compared = 0
    for model_config in sample:
        (folder / "config.json").write_text(json.dumps(accepted[model_config]))
        try:
            model = load_model(folder, compilation_config={"level": 0})
        except CheckpointError as exc:  # keys that disagree with the weights
            assert "\n" not in str(exc) and "config.json" in str(exc), accepted[model_config]
            continue
        if compared == COMPARED or model.config.max_position < len(PROMPT) + NEW_TOKENS:
            continue
        compared += 1
        runner = ModelRunner(model, num_blocks=4)
        _, tokens = run_steps(runner, [PROMPT], NEW_TOKENS - 1)
        expected = reference_greedy(folder, PROMPT, NEW_TOKENS)
        continuation = tokens[0][len(PROMPT) :][: len(expected)]
        assert continuation == expected[: NEW_TOKENS - 1], accepted[model_config]
    assert compared >= 1


def test_slotwise_generate_reports_a_bad_config_in_one_line_and_exits_2(tmp_path, capsys):
    from hf_checkpoints import edit_config
    from hf_tokenizers import make_tokenizer

    from slotwise.cli.main import main

    folder = make_checkpoint("llama", tmp_path / "llama")
    make_tokenizer(folder)
    edit_config(folder, lambda c: c.update(rms_norm_eps=math.nan))
    capsys.readouterr()
    status = main(["generate", "--model", str(folder), "--prompt", "hi", "-O.level=0"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert status == 2
    assert errors == [
        f"slotwise generate: error: {folder / 'config.json'}: field 'rms_norm_eps' is nan; "
        "expected a finite number > 1.17549e-38, at most 3.403e+38"
    ]
