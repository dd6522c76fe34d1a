"""The checkpoints the server's tests serve, made once per run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

# The checkpoint and tokenizer makers of the model tests, in the repository's tests/
# (appended: nothing there shadows a module of the engine's tests).
ROOT_TESTS = str(Path(__file__).resolve().parents[3] / "tests")
if ROOT_TESTS not in sys.path:
    sys.path.append(ROOT_TESTS)

from models.hf_checkpoints import edit_config, make_checkpoint  # noqa: E402
from models.hf_tokenizers import make_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random two-layer Llama with a byte-level tokenizer and a chat template."""
    folder = make_checkpoint("llama", tmp_path_factory.mktemp("serve") / "tiny")
    return make_tokenizer(folder, "llama3")


@pytest.fixture(scope="session")
def long_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model with a 4096-token context: requests long enough to still run
    when a test acts on them (a full queue, a shutdown)."""
    folder = tmp_path_factory.mktemp("serve-long") / "tiny"
    shutil.copytree(tiny_checkpoint, folder)

    def longer(config: dict) -> None:
        config["max_position_embeddings"] = 4096

    edit_config(folder, longer)
    return folder
