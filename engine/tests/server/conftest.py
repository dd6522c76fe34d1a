"""The checkpoints the server's tests serve, made once per run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from models.hf_checkpoints import edit_config, make_checkpoint
from models.hf_tokenizers import make_tokenizer


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
