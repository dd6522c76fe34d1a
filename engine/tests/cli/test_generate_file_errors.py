"""`slotwise generate` on a model folder whose files are broken, unreadable or changed
while it loads: one line naming the file and the fix, exit status 2, never a traceback
or a crash.

The tiny checkpoint is a random Llama with a tokenizer trained at test time.  Errors
that end the process by other means than an exception (SIGBUS, a permission the test
runner's root would override) are checked in a child process.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from models.hf_checkpoints import make_checkpoint
from models.hf_tokenizers import make_tokenizer
from safetensors import SafetensorError, safe_open
from support import clean_env

from slotwise.attention.registry import get_attention_backend_registry
from slotwise.compilation.config import ENV_CONFIG
from slotwise.platforms import get_current_platform

cli_main = importlib.import_module("slotwise.cli.main")

#: An integer past Python's limit on converting digit strings (4300 digits).
HUGE = "9" * 5000
#: A child's environment: no compile cache, no INFO lines around the error.
CHILD_ENV = clean_env(SLOTWISE_DISABLE_COMPILE_CACHE="1", SLOTWISE_LOGGING_LEVEL="WARNING")
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    folder = make_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    return make_tokenizer(folder, "llama3")


@pytest.fixture
def folder(pristine, tmp_path) -> Path:
    """A copy of a good checkpoint, for a test to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "checkpoint"))


@pytest.fixture
def generate(monkeypatch, capsys):
    """main() of `slotwise generate` on a folder, in this process: (exit code, stderr)."""
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", "1")
    monkeypatch.setattr(cli_main, "configure_logging", lambda: None)

    def run(folder: Path, *args: str) -> tuple[int, str]:
        argv = ["generate", "--model", str(folder), "--prompt", "hi", "-O0", *args]
        code = cli_main.main([*argv, "--max-new-tokens", "2"])
        return code, capsys.readouterr().err

    return run


def one_error(err: str) -> str:
    """The message of the one error line ``err`` holds."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("slotwise generate: error: "), err
    return lines[0].removeprefix("slotwise generate: error: ")


def with_huge_integer(path: Path) -> None:
    """Add a key whose value is a 5,000-digit integer to the JSON object in ``path``."""
    text = path.read_text().rstrip()
    assert text.endswith("}")
    path.write_text(f'{text[:-1].rstrip()}, "extra": {HUGE}}}')


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json"])
def test_an_integer_past_pythons_digit_limit_is_named(folder, generate, name):
    with_huge_integer(folder / name)
    code, err = generate(folder)
    message = one_error(err)
    assert code == 2
    assert message.startswith(f"{folder / name}: not readable JSON (")
    assert "5000 digits" in message and "download it again" in message
    assert "set_int_max_str_digits" not in message  # advice for programmers, not users


def test_an_index_with_a_huge_integer_is_named(folder, generate):
    with safe_open(folder / "model.safetensors", "pt") as file:
        names = list(file.keys())
    index = {"metadata": {"total_size": 0}, "weight_map": dict.fromkeys(names, "model.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with_huge_integer(folder / "model.safetensors.index.json")
    code, err = generate(folder)
    assert code == 2
    assert one_error(err).startswith(f"{folder / 'model.safetensors.index.json'}: not readable")


def test_a_safetensors_header_with_a_huge_integer_is_named(folder, generate):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    text = json.dumps(header)[:-1] + f', "__other__": {HUGE}}}'
    path.write_bytes(struct.pack("<Q", len(text)) + text.encode() + data[8 + length :])
    with pytest.raises(SafetensorError):  # the format's own library refuses it too
        safe_open(path, "pt")
    code, err = generate(folder)
    message = one_error(err)
    assert code == 2
    assert message.startswith(f"{path}: not a readable safetensors file (")
    assert "5000 digits" in message


@pytest.mark.parametrize(
    "entry, problem",
    [
        ({"name": ["default"], "template": "{{ 1 }}"}, "entry 1 has a 'name' that is a list"),
        ({"name": "default", "template": 7}, "entry 1 has a 'template' that is a number"),
        ({"template": "{{ 1 }}"}, "entry 1 has no 'name'"),
        ("default", "entry 1 is a string"),
    ],
)
def test_a_broken_entry_of_a_chat_template_list_is_named(folder, generate, entry, problem):
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "{{ 2 }}"}, entry]
    config_path.write_text(json.dumps(config))
    code, err = generate(folder, "--chat")
    message = one_error(err)
    assert code == 2
    assert message.startswith(f"{config_path} (chat_template): {problem}; ")
    assert '{"name": string, "template": string}' in message


def test_the_default_of_a_chat_template_list_renders_as_transformers_renders_it(folder):
    import transformers

    from slotwise_engine.models.tokenizer import Tokenizer

    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "{{ 'tools' }}"},
        {"name": "default", "template": config["chat_template"]},
    ]
    config_path.write_text(json.dumps(config))
    messages = [{"role": "user", "content": "Hello world"}]
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    expected = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert Tokenizer.load(folder).apply_chat_template(messages) == expected


def test_an_unknown_attention_backend_lists_the_known_ones(folder, generate, monkeypatch):
    monkeypatch.setenv("SLOTWISE_ATTENTION_BACKEND", "NOPE")
    code, err = generate(folder)
    message = one_error(err)
    assert code == 2
    platform = get_current_platform().name
    assert message.startswith(
        f"SLOTWISE_ATTENTION_BACKEND=NOPE: unknown attention backend name 'NOPE' for "
        f"platform {platform!r}; known: "
    )
    for entry in get_attention_backend_registry().entries(platform):
        assert entry.load().get_name() in message
    assert "set SLOTWISE_ATTENTION_BACKEND to a known name" in message
    assert "dtype" not in message and "load_model" not in message


def without_permission_override() -> None:
    """Run the child as its user's permissions say: root reads any file unless it drops
    the capabilities that override them (it keeps them in this process)."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_generate(folder: Path, **preexec: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotwise", "generate", "--model", str(folder),
         "--prompt", "hi", "-O0", "--max-new-tokens", "2"],
        capture_output=True, text=True, timeout=300,
        env=CHILD_ENV, **preexec,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer_config.json"])
def test_a_file_the_user_cannot_read_is_called_so(folder, name):
    (folder / name).chmod(0)
    try:
        result = run_generate(folder, preexec_fn=without_permission_override)
    except subprocess.SubprocessError as exc:  # prctl refused: no CAP_SETPCAP
        pytest.skip(f"cannot drop root's permission override here: {exc}")
    message = one_error(result.stderr)
    assert result.returncode == 2
    assert message.startswith(f"{folder / name}: permission denied")
    assert "corrupt" not in message and "truncated" not in message


TRUNCATE_WHILE_LOADING = """
import os, sys
from pathlib import Path
from slotwise.cli.main import main
from slotwise_engine.models import checkpoint

opened = checkpoint.Checkpoint.__init__

def open_then_truncate(self, folder):
    # Another process cutting the file short once its header has been checked.
    opened(self, folder)
    os.truncate(Path(folder) / "model.safetensors", 4096)

checkpoint.Checkpoint.__init__ = open_then_truncate
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_file_truncated_while_it_loads_is_an_error_not_a_crash(folder):
    result = subprocess.run(
        [sys.executable, "-c", TRUNCATE_WHILE_LOADING, "generate", "--model", str(folder),
         "--prompt", "hi", "-O0", "--max-new-tokens", "2"],
        capture_output=True, text=True, timeout=300, env=CHILD_ENV,
    )  # fmt: skip
    assert result.returncode == 2, f"exit status {result.returncode}: {result.stderr[-2000:]}"
    message = one_error(result.stderr)
    path = folder / "model.safetensors"
    assert message.startswith(f"{path}: ends at byte 4,096, inside tensor ")
    assert "truncated or replaced while slotwise read it" in message
