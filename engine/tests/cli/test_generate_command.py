"""`slotwise generate` on a tiny Llama checkpoint with a tokenizer trained at test time.

transformers, reading the same folder, is the oracle: its tokenizer gives the prompt
ids, and ``model.generate`` (greedy, exactly N new tokens) the continuation.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from models.hf_checkpoints import make_checkpoint
from models.hf_tokenizers import make_tokenizer
from support import clean_env, torchrun

from slotwise.compilation.config import ENV_CONFIG

cli_main = importlib.import_module("slotwise.cli.main")

PROMPTS = ["Hello world, the quick fox", "Grüße aus Köln 日本語 🙂"]
N = 12
LEVELS = {"level0": ["-O0"], "level3-eager": ["-O3", "-O.backend=eager"]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = make_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    return make_tokenizer(folder, "llama3")


@pytest.fixture
def generate(monkeypatch, capsys):
    """main() of `slotwise generate` in this process: (exit code, stdout, stderr)."""
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", "1")
    monkeypatch.setattr(cli_main, "configure_logging", lambda: None)

    def run(*args: str) -> tuple[int, str, str]:
        code = cli_main.main(["generate", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def transformers_greedy(folder: Path, prompt_ids: list[int]) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    output = model.generate(
        torch.tensor([prompt_ids]), do_sample=False, min_new_tokens=N, max_new_tokens=N
    )
    return output[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("level", sorted(LEVELS))
@pytest.mark.parametrize("chat", [False, True])
def test_ignore_eos_json_matches_transformers_generate(folder, generate, level, chat):
    prompt_args = [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]
    chat_args = ["--chat"] if chat else []
    code, out, err = generate(
        "--model", str(folder), *prompt_args, "--max-new-tokens", str(N), "--ignore-eos",
        "--json", *chat_args, *LEVELS[level],
    )  # fmt: skip
    assert code == 0, err
    results = json_lines(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    end_ids = set(json.loads((folder / "generation_config.json").read_text())["eos_token_id"])
    for prompt, result in zip(PROMPTS, results, strict=True):
        if chat:
            messages = [{"role": "user", "content": prompt}]
            expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            assert result["prompt_token_ids"] == expected["input_ids"]
        else:
            assert result["prompt_token_ids"] == tokenizer(prompt)["input_ids"]
        assert result["prompt"] == prompt and len(result["token_ids"]) == N
        # min_new_tokens suppresses end ids where --ignore-eos goes past them: the two
        # agree while no end id is the argmax.
        assert not end_ids & set(result["token_ids"])
        assert result["token_ids"] == transformers_greedy(folder, result["prompt_token_ids"])
        assert result["text"] == tokenizer.decode(result["token_ids"], skip_special_tokens=True)
        assert result["finish_reason"] == "length"
        assert result["ttft_s"] > 0 and result["tokens_per_second"] > 0
    assert "time to first token" in err and "tokens/s" in err


def test_streamed_text_equals_the_final_decode(folder, generate):
    common = ["--model", str(folder), "--prompt", PROMPTS[1], "--max-new-tokens", "24", "-O0"]
    code, streamed, err = generate(*common, "--ignore-eos")
    assert code == 0, err
    code, out, _ = generate(*common, "--ignore-eos", "--json")
    (result,) = json_lines(out)
    assert streamed == result["text"] + "\n"
    assert "slotwise generate: 24 tokens; time to first token" in err


def test_generation_stops_at_an_end_id(folder, generate, tmp_path):
    common = ["--prompt", PROMPTS[0], "--max-new-tokens", str(N), "--json", "-O0"]
    _, out, _ = generate("--model", str(folder), *common, "--ignore-eos")
    tokens = json_lines(out)[0]["token_ids"]
    config = folder / "generation_config.json"
    saved = config.read_text()
    try:
        config.write_text(json.dumps({"eos_token_id": [tokens[4]]}))
        _, out, _ = generate("--model", str(folder), *common)
    finally:
        config.write_text(saved)
    (result,) = json_lines(out)
    assert result["token_ids"] == tokens[: tokens.index(tokens[4]) + 1]
    assert result["finish_reason"] == "stop"


def test_several_prompts_print_each_whole_under_a_header(folder, generate):
    prompt_args = [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]
    common = ["--model", str(folder), *prompt_args, "--max-new-tokens", "6", "-O0"]
    code, out, err = generate(*common, "--ignore-eos")
    assert code == 0, err
    code, as_json, _ = generate(*common, "--ignore-eos", "--json")
    texts = [result["text"] for result in json_lines(as_json)]
    assert out == f"[prompt 0]\n{texts[0]}\n[prompt 1]\n{texts[1]}\n"
    assert "2 prompts, 12 tokens; time to first token" in err


@pytest.mark.slow
def test_tensor_parallel_ranks_generate_the_single_process_tokens(folder, generate):
    prompt_args = [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]
    args = ["--model", str(folder), *prompt_args, "--max-new-tokens", "8", "--ignore-eos",
            "--json", "-O0"]  # fmt: skip
    _, single, _ = generate(*args)
    result = torchrun("-m", "slotwise", "generate", "--tp", "2", *args, SLOTWISE_DIST_TIMEOUT="120")
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = json_lines(result.stdout)  # rank 0 alone prints
    assert [r["token_ids"] for r in ranks] == [r["token_ids"] for r in json_lines(single)]


def test_seeded_sampling_repeats(folder, generate):
    args = ["--model", str(folder), "--prompt", PROMPTS[0], "--max-new-tokens", "8", "-O0"]
    sampled = ["--temperature", "1.5", "--top-k", "50", "--top-p", "0.95", "--seed", "3"]
    runs = [json_lines(generate(*args, *sampled, "--json")[1])[0] for _ in range(2)]
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    greedy = json_lines(generate(*args, "--json")[1])[0]
    assert runs[0]["token_ids"] != greedy["token_ids"]


TEMPERATURES = "expected 0 or a number in [1e-05, 100000]"
SEEDS = f"expected an integer from 0 to {2**64 - 1}"  # what torch.Generator takes
TOKEN_COUNTS = "expected an integer from 1 to 2147483647"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], f"argument --temperature: {TEMPERATURES}, got '-1'"),
        (["--temperature", "nan"], f"argument --temperature: {TEMPERATURES}, got 'nan'"),
        (["--temperature", "inf"], f"argument --temperature: {TEMPERATURES}, got 'inf'"),
        # float32 makes 1e-50 a 0, and the logits over it inf or nan
        (["--temperature", "1e-50"], f"argument --temperature: {TEMPERATURES}, got '1e-50'"),
        (["--top-p", "0"], "argument --top-p: expected a number in (0, 1], got '0'"),
        (["--top-p", "1.5"], "argument --top-p: expected a number in (0, 1], got '1.5'"),
        (["--top-k", "-1"], "argument --top-k: expected an integer from 0 to 2147483647, got '-1'"),
        (["--top-k", str(2**63)], "argument --top-k: expected an integer from 0 to 2147483647"),
        (["--seed", "x"], f"argument --seed: {SEEDS}, got 'x'"),
        (["--seed", "-1"], f"argument --seed: {SEEDS}, got '-1'"),
        (["--seed", str(2**64)], f"argument --seed: {SEEDS}, got '{2**64}'"),
        (["--seed", "9" * 5000], f"argument --seed: {SEEDS}, got '99"),
        (["--max-new-tokens", "0"], f"argument --max-new-tokens: {TOKEN_COUNTS}, got '0'"),
        (["--max-new-tokens", str(2**31)], f"argument --max-new-tokens: {TOKEN_COUNTS}, got"),
        (["--tp", "0"], "argument --tp: expected an integer from 1 to 1024, got '0'"),
        (["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
    ],
)  # fmt: skip
def test_bad_numbers_are_refused_when_parsing(generate, capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        generate("--model", "nowhere", "--prompt", "hi", *args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.splitlines()) == 1 and err.endswith("(see 'slotwise generate --help')\n")


def test_the_largest_seed_torch_takes_is_accepted(folder, generate):
    args = ["--model", str(folder), "--prompt", PROMPTS[0], "--max-new-tokens", "4", "-O0"]
    code, out, err = generate(*args, "--temperature", "1", "--seed", str(2**64 - 1), "--json")
    assert code == 0, err
    assert len(json_lines(out)[0]["token_ids"]) >= 1


def test_a_prompt_that_is_not_utf8_is_refused_in_one_line():
    result = subprocess.run(
        [sys.executable.encode(), b"-m", b"slotwise", b"generate", b"--model", b"x",
         b"--prompt", b"caf\xe9 ok", b"-O0"],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and not result.stdout
    assert result.stderr == (
        "slotwise generate: error: argument --prompt: not valid UTF-8 (byte 0xe9 at "
        "character 3); pass UTF-8 text (see 'slotwise generate --help')\n"
    )


def test_bad_numbers_exit_2_with_the_reason_in_one_process():
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "generate", "--model", "x", "--prompt", "hi",
         "--top-p", "2"],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "argument --top-p: expected a number in (0, 1], got '2'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("missing", ["--model", "--prompt"])
def test_model_and_prompt_are_required(generate, capsys, missing):
    args = {"--model": "x", "--prompt": "hi"}
    del args[missing]
    with pytest.raises(SystemExit) as exit_:
        generate(*[part for pair in args.items() for part in pair])
    assert exit_.value.code == 2
    assert f"the following arguments are required: {missing}" in capsys.readouterr().err


def checks_before_loading(monkeypatch) -> None:
    """Make any model load fail the test: these errors must come first."""
    import slotwise_engine.models.loader as loader

    def load_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(loader, "load_model", load_model)


def test_a_missing_tokenizer_json_is_named(folder, generate, monkeypatch, tmp_path):
    checks_before_loading(monkeypatch)
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    code, out, err = generate("--model", str(tmp_path), "--prompt", "hi")
    assert code == 2 and not out
    assert err.startswith(f"slotwise generate: error: {tmp_path / 'tokenizer.json'}: missing")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "/no/such/folder"], "argument --model: /no/such/folder: no such folder"),
        (["--tp", "2", "--temperature", "1"], "argument --seed: sampling under --tp needs a seed"),
        (["-O.levle=3"], "did you mean 'level'"),
    ],
)
def test_arguments_are_checked_before_loading(folder, generate, monkeypatch, args, message):
    checks_before_loading(monkeypatch)
    code, _, err = generate("--model", str(folder), "--prompt", "hi", *args)
    assert code == 2 and message in err


def test_chat_without_a_template_is_refused_before_loading(folder, generate, monkeypatch, tmp_path):
    checks_before_loading(monkeypatch)
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_text((folder / name).read_text())
    code, _, err = generate("--model", str(tmp_path), "--prompt", "hi", "--chat")
    assert code == 2 and "no chat template" in err and "without --chat" in err


def test_a_prompt_too_long_for_the_model_is_refused(folder, generate):
    code, out, err = generate(
        "--model", str(folder), "--prompt", "hi", "--max-new-tokens", "300", "-O0"
    )
    assert code == 2 and not out
    assert (
        "argument --prompt: prompt 0 has 3 tokens and asks for 300 more, over max_model_len 256"
        in err
    )


def test_the_parser_imports_no_heavy_package():
    code = (
        "import sys\n"
        "from slotwise.cli.main import build_parser\n"
        "build_parser().parse_args(['generate', '--model', 'x', '--prompt', 'y'])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'tokenizers', 'safetensors', 'jinja2', 'transformers'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
