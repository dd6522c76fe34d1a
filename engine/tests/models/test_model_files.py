"""A model folder's files are read only when they are regular files of that model: inside
the folder, or blobs of the Hugging Face cache repository the folder is a snapshot of.
Links to /proc, devices, FIFOs and files elsewhere are refused with one error naming
the file, before anything is read or mapped."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch
from hf_tokenizers import make_tokenizer
from safetensors.torch import save_file

from slotwise_engine.models import CheckpointError
from slotwise_engine.models.checkpoint import Checkpoint
from slotwise_engine.models.model_files import model_file, read_model_file
from slotwise_engine.models.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("never_hang")


def hf_cache(root: Path, repo: str, folder: Path, revision: str = "abc123") -> Path:
    """``folder``'s files moved into a Hugging Face cache layout under ``root``:
    ``models--<repo>/blobs/<sha256>`` and ``snapshots/<revision>/<name>`` linking to
    ``../../blobs/<sha256>``, as the hub client stores them.  Returns the snapshot."""
    repository = root / f"models--{repo.replace('/', '--')}"
    blobs = repository / "blobs"
    snapshot = repository / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in sorted(folder.iterdir()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blobs / digest)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", digest))
    return snapshot


def test_a_regular_file_of_the_folder_is_read(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"a": 1}')
    assert read_model_file(tmp_path, "config.json", limit=100) == b'{"a": 1}'
    assert model_file(tmp_path, "config.json") == (tmp_path / "config.json").resolve()


def test_a_link_to_proc_self_environ_is_refused(tmp_path):
    folder = make_tokenizer(tmp_path / "model", "qwen2")
    (folder / "chat_template.jinja").symlink_to("/proc/self/environ")
    with pytest.raises(CheckpointError) as caught:
        Tokenizer.load(folder)
    message = str(caught.value)
    assert message.startswith(str(folder / "chat_template.jinja"))
    assert f"resolves to /proc/{os.getpid()}/environ, outside the model folder" in message
    assert "replace the link with a copy" in message


def test_a_link_to_dev_zero_is_refused(tmp_path):
    folder = make_tokenizer(tmp_path / "model", "llama3")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: resolves to /dev/zero"):
        Tokenizer.load(folder)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    folder = make_tokenizer(tmp_path / "model", "llama3")
    (folder / "generation_config.json").unlink()
    os.mkfifo(folder / "generation_config.json")  # no writer: an open for reading blocks
    with pytest.raises(CheckpointError, match=r"generation_config\.json: a FIFO, not a regular"):
        Tokenizer.load(folder)


def test_a_link_inside_the_folder_to_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "config.json").symlink_to("pipe")
    with pytest.raises(CheckpointError, match=r"config\.json: a FIFO \(through a link to .*pipe\)"):
        read_model_file(tmp_path, "config.json", limit=100)


def test_a_directory_is_refused(tmp_path):
    folder = make_tokenizer(tmp_path / "model", "qwen2")
    (folder / "chat_template.jinja").mkdir()
    with pytest.raises(CheckpointError, match=r"chat_template\.jinja: a directory"):
        Tokenizer.load(folder)


def test_a_link_to_a_file_in_a_sibling_folder_is_refused(tmp_path):
    folder = make_tokenizer(tmp_path / "model", "qwen2")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "chat_template.jinja").write_text("{{ 'not this model' }}")
    (folder / "chat_template.jinja").symlink_to(Path("..", "other", "chat_template.jinja"))
    with pytest.raises(CheckpointError, match="outside the model folder"):
        Tokenizer.load(folder)


def test_a_dangling_link_is_named(tmp_path):
    (tmp_path / "config.json").symlink_to("gone.json")
    with pytest.raises(
        CheckpointError, match=r"config\.json: a link to gone\.json, which does not"
    ):
        read_model_file(tmp_path, "config.json", limit=100)


def test_a_file_over_its_kinds_limit_is_refused(tmp_path):
    (tmp_path / "config.json").write_bytes(b" " * 101)
    with pytest.raises(CheckpointError, match=r"config\.json: 101 bytes, over the 100 bytes"):
        read_model_file(tmp_path, "config.json", limit=100)


def test_the_hugging_face_cache_layout_is_read_through_its_blob_links(tmp_path):
    plain = make_tokenizer(tmp_path / "plain", "llama3")
    (plain / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    snapshot = hf_cache(tmp_path / "hub", "org/model", plain)
    assert (snapshot / "tokenizer.json").is_symlink()
    # A folder reached through a link of its own (a models/ shortcut) is the same snapshot.
    (tmp_path / "shortcut").symlink_to(snapshot)
    expected = Tokenizer.load(plain)
    for folder in (snapshot, tmp_path / "shortcut"):
        loaded = Tokenizer.load(folder)
        assert loaded.encode("Hello world") == expected.encode("Hello world")
        assert loaded.eos_token_ids == expected.eos_token_ids
        assert loaded.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"


def test_a_snapshot_link_to_another_revision_or_repository_is_refused(tmp_path):
    plain = make_tokenizer(tmp_path / "plain", "qwen2")
    snapshot = hf_cache(tmp_path / "hub", "org/model", plain)
    other_revision = hf_cache(tmp_path / "hub", "org/model", plain, revision="def456")
    (other_revision / "chat_template.jinja").write_text("{{ 'another revision' }}")
    (snapshot / "chat_template.jinja").symlink_to(Path("..", "def456", "chat_template.jinja"))
    with pytest.raises(CheckpointError, match="outside the model folder"):
        Tokenizer.load(snapshot)
    (snapshot / "chat_template.jinja").unlink()
    foreign = hf_cache(tmp_path / "hub", "evil/model", plain)
    blob = os.readlink(foreign / "tokenizer_config.json")
    (snapshot / "tokenizer_config.json").unlink()
    (snapshot / "tokenizer_config.json").symlink_to(foreign / blob)
    with pytest.raises(CheckpointError, match="models--evil--model/blobs/.*outside the model"):
        Tokenizer.load(snapshot)


def write_weights(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4)}
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return tensors


def test_safetensors_through_the_cache_layout_are_mapped(tmp_path):
    tensors = write_weights(tmp_path / "plain")
    snapshot = hf_cache(tmp_path / "hub", "org/model", tmp_path / "plain")
    with Checkpoint(snapshot) as checkpoint:
        for name, tensor in tensors.items():
            assert torch.equal(checkpoint.tensor(name)[:], tensor)


def test_a_safetensors_link_to_a_device_is_refused_before_mapping(tmp_path):
    (tmp_path / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: resolves to /dev/zero"):
        Checkpoint(tmp_path)


def test_an_index_naming_a_shard_outside_the_folder_is_refused(tmp_path):
    write_weights(tmp_path / "elsewhere")
    folder = tmp_path / "model"
    folder.mkdir()
    index = '{"weight_map": {"a": "../elsewhere/model.safetensors"}}'
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match="outside the model folder"):
        Checkpoint(folder)


def test_an_index_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors.index.json")
    with pytest.raises(CheckpointError, match=r"index\.json: a FIFO"):
        Checkpoint(tmp_path)


@pytest.mark.parametrize("kind", ["proc", "fifo"])
def test_config_json_is_read_only_as_a_regular_file_of_the_folder(tmp_path, kind):
    from slotwise_engine.models.hf_config import HFConfig

    config = tmp_path / "config.json"
    if kind == "proc":
        config.symlink_to("/proc/self/environ")
    else:
        os.mkfifo(config)
    with pytest.raises(CheckpointError, match=r"config\.json") as caught:
        HFConfig.read(tmp_path)
    assert "missing" not in str(caught.value) and "\n" not in str(caught.value)
