"""Logits with NaN or infinity stop generation with one error that names the
checkpoint, its dtype and what to try, instead of token 0 step after step.

Two broken checkpoints, made from a tiny random Llama: one with two NaN weights, one
whose first MLP is scaled so that its activations overflow float16 but not float32
(transformers, reading the same folder, is the oracle that they do).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from models.hf_checkpoints import make_checkpoint
from models.hf_tokenizers import make_tokenizer
from safetensors.torch import load_file, save_file
from support import clean_env

from slotwise.compilation import CompilationConfig
from slotwise.compilation.config import ENV_CONFIG
from slotwise.errors import SlotwiseError
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.runner.sampling import SamplingParams
from slotwise_engine.serving.generation import Completion, NonFiniteLogitsError, generate

cli_main = importlib.import_module("slotwise.cli.main")

NAN_WEIGHT = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_tokenizer(make_checkpoint("llama", tmp_path_factory.mktemp("base")), "llama3")


def edited_copy(base: Path, folder: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    shutil.copytree(base, folder)
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def nan_weights(base, tmp_path_factory) -> Path:
    def poison(weights: dict[str, torch.Tensor]) -> None:
        weights[NAN_WEIGHT].view(-1)[5] = float("nan")
        weights["model.layers.1.self_attn.q_proj.weight"].view(-1)[7] = float("nan")

    return edited_copy(base, tmp_path_factory.mktemp("nan") / "checkpoint", poison)


@pytest.fixture(scope="module")
def overflows_float16(base, tmp_path_factory) -> Path:
    """Weights up to about 360 (float16 holds them): the first MLP's products reach 1e7."""

    def scale(weights: dict[str, torch.Tensor]) -> None:
        for name, weight in weights.items():
            if name.startswith("model.layers.0.mlp."):
                weight.mul_(300.0)

    return edited_copy(base, tmp_path_factory.mktemp("huge") / "checkpoint", scale)


@pytest.fixture
def slotwise_generate(monkeypatch, capsys):
    """main() of `slotwise generate` in this process: (exit code, stdout, stderr)."""
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.setattr(cli_main, "configure_logging", lambda: None)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()  # what came before (transformers' progress bars) is not its
        code = cli_main.main(["generate", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_nan_weights_end_generate_in_one_line_naming_the_weight(nan_weights, slotwise_generate):
    code, out, err = slotwise_generate(
        "--model", str(nan_weights), "--prompt", "Hello world", "--prompt", "Grüße",
        "--max-new-tokens", "4", "-O0",
    )  # fmt: skip
    assert code == 2 and not out
    assert err == (
        "slotwise generate: error: the logits for token 1 of prompts 0, 1 hold NaN or "
        f"infinity (checkpoint {nan_weights}, float32): its weight {NAN_WEIGHT} holds NaN or "
        "infinity: the checkpoint is damaged; download or export it again\n"
    )


def test_sampling_from_nan_logits_is_refused_too(nan_weights, slotwise_generate):
    code, out, err = slotwise_generate(
        "--model", str(nan_weights), "--prompt", "Hello", "--temperature", "0.8",
        "--seed", "1", "-O0", "--json",
    )  # fmt: skip
    assert code == 2 and not out
    assert err.startswith("slotwise generate: error: the logits for token 1 of prompt 0 hold")
    assert len(err.splitlines()) == 1


def test_float16_overflow_is_reported_with_the_dtypes_to_try(overflows_float16, slotwise_generate):
    ids = transformers.AutoTokenizer.from_pretrained(overflows_float16)("Hello world").input_ids
    for dtype, finite in ((torch.float16, False), (torch.float32, True)):
        model = transformers.AutoModelForCausalLM.from_pretrained(overflows_float16, dtype=dtype)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits
        assert bool(logits.isfinite().all()) is finite, dtype  # the oracle: it overflows

    args = ["--model", str(overflows_float16), "--prompt", "Hello world", "-O0", "--json"]
    code, out, err = slotwise_generate(*args, "--dtype", "float16")
    assert code == 2 and not out
    assert len(err.splitlines()) == 1
    assert err.startswith(
        "slotwise generate: error: the logits for token 1 of prompt 0 hold NaN or infinity "
        f"(checkpoint {overflows_float16}, float16): its weights are finite, so an activation "
        "overflowed float16 (largest value 65504); run it in float32 (slotwise generate "
        "--dtype float32"
    )
    assert "or in the dtype it was saved in (config.json's dtype, the default)" in err
    # What the error says to try works.
    for fix in (["--dtype", "float32"], []):
        code, out, err = slotwise_generate(*args, "--max-new-tokens", "4", *fix)
        assert code == 0, err
        assert out.count('"token_ids"') == 1


@pytest.mark.slow
def test_the_installed_command_prints_one_error_line_and_no_traceback(nan_weights):
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "generate", "--model", str(nan_weights),
         "--prompt", "Hello", "-O0"],
        capture_output=True, text=True, env=clean_env(), timeout=300,
    )  # fmt: skip
    assert result.returncode == 2 and not result.stdout
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [result.stderr.splitlines()[-1]]
    assert errors[0].startswith("slotwise generate: error: the logits for token 1 of prompt 0")
    assert "Traceback" not in result.stderr


# -- the library: any step, any row ----------------------------------------------------

PROMPTS = [[1, 2, 3], [5], [42, 11, 100, 3]]
BLOCKS = 32


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    model = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    return ModelRunner(model, num_blocks=BLOCKS)


@pytest.mark.parametrize(
    "poison",
    [
        pytest.param(lambda row: row.__setitem__(17, float("nan")), id="one-nan"),
        pytest.param(lambda row: row.__setitem__(17, float("inf")), id="one-inf"),
        pytest.param(lambda row: row.fill_(float("-inf")), id="all-minus-inf"),
    ],
)
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=0)])
def test_a_later_step_with_bad_logits_stops_naming_its_token_and_prompt(
    runner, monkeypatch, poison, sampling
):
    step = runner.step
    calls = []

    def third_step_poisons_row_1(sequences):
        logits = step(sequences)
        calls.append(len(sequences))
        if len(calls) == 3:
            poison(logits[1])
        return logits

    monkeypatch.setattr(runner, "step", third_step_poisons_row_1)
    streamed: list[list[int]] = []

    def on_step(stepped: list[Completion]) -> None:
        streamed.append([len(c.token_ids) for c in stepped])

    with pytest.raises(NonFiniteLogitsError) as error:
        generate(
            runner, PROMPTS, max_new_tokens=8, sampling=sampling, on_step=on_step,
            checkpoint="/models/tiny",
        )  # fmt: skip
    assert str(error.value).startswith(
        "the logits for token 3 of prompt 1 hold NaN or infinity (checkpoint /models/tiny, "
        "float32): its weights are finite, so an activation overflowed float32 or a kernel "
        "wrote NaN; run it at -O0"
    )
    assert isinstance(error.value, SlotwiseError)
    assert streamed == [[1, 1, 1], [2, 2, 2]]  # the bad step reached no one
    assert runner.allocator.num_free_blocks == BLOCKS


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=0)])
def test_minus_inf_logits_are_tokens_never_drawn(runner, monkeypatch, sampling):
    """What masking writes: the other tokens are drawn as if it were not there."""
    expected = [c.token_ids for c in generate(runner, PROMPTS, max_new_tokens=4, sampling=sampling)]
    kept = {token for tokens in expected for token in tokens}
    step = runner.step

    def mask(sequences):
        logits = step(sequences)
        logits[:, sorted(set(range(logits.shape[-1])) - kept)] = float("-inf")
        return logits

    monkeypatch.setattr(runner, "step", mask)
    masked = generate(runner, PROMPTS, max_new_tokens=4, sampling=sampling)
    assert [c.token_ids for c in masked] == expected
    assert runner.allocator.num_free_blocks == BLOCKS


def test_rows_are_named_by_prompt_after_others_finished(runner, monkeypatch):
    """Prompt 0 ends after one token; the batch's row 1 is then prompt 2."""
    step = runner.step

    def poison_second_row_once_two_remain(sequences):
        logits = step(sequences)
        if len(sequences) == 2:
            logits[1] = float("nan")
        return logits

    first = generate(runner, [PROMPTS[0]], max_new_tokens=1)[0].token_ids[0]
    monkeypatch.setattr(runner, "step", poison_second_row_once_two_remain)
    with pytest.raises(NonFiniteLogitsError, match=r"^the logits for token 2 of prompt 2 hold"):
        generate(runner, PROMPTS, max_new_tokens=4, eos_token_ids={first})
    assert runner.allocator.num_free_blocks == BLOCKS
