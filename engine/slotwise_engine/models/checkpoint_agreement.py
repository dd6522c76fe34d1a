"""What tensor-parallel ranks must share before they load a checkpoint, and the check.

Each rank loads its own slice of one model from its own copy of the folder.  A rank
given another checkpoint, of other shapes or of the same shapes with other weights,
or running other slotwise or torch versions, computes garbage or aborts in a
collective whose shapes no longer match.  So before anything is loaded the ranks
compare (``check_ranks_agree``) config.json, the safetensors headers (tensor names,
shapes, dtypes), a sample of every tensor's bytes and the versions.  It reads the
headers and 128 bytes of each tensor, however large the model (some 35 ms for 700
tensors from the page cache).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

import torch

from slotwise.distributed import Fact, check_ranks_agree, get_tp_communicator
from slotwise.distributed import state as distributed_state
from slotwise.errors import SlotwiseError
from slotwise.version import __version__ as slotwise_version
from slotwise_engine.models.checkpoint import Checkpoint
from slotwise_engine.models.hf_config import read_config_text
from slotwise_engine.models.model_files import model_file

#: Bytes read at the start and at the middle of each tensor: weights that differ at all
#: differ there (a fine-tune or another seed changes nearly every element).
SAMPLE_BYTES = 64
#: The safetensors format's own bound on a header.
HEADER_LIMIT = 100_000_000

CONFIG = "config.json"
LAYOUT = "the tensor names, shapes and dtypes"
WEIGHTS = "the weights (sampled)"
VERSIONS = "the versions"
SAME_CHECKPOINT = "load the same checkpoint on every rank (copy its folder byte for byte)"
SAME_VERSIONS = "install the same slotwise, slotwise-engine and torch on every machine"
#: What reading a checkpoint raises when a file is missing, unreadable or malformed.
_READ_ERRORS = (SlotwiseError, OSError, ValueError, KeyError, TypeError)


def check_checkpoint_agreement(folder: str | Path) -> None:
    """Under tensor parallelism, raise ``RankDisagreementError`` on every rank unless
    all ranks of the group hold the same checkpoint ``folder`` and versions."""
    if distributed_state.get_tensor_parallel_world_size() > 1:
        check_ranks_agree(get_tp_communicator(), checkpoint_facts(Path(folder)))


def checkpoint_facts(folder: Path) -> list[Fact]:
    """config.json, the tensors' layout, their sampled bytes and the versions.

    A file this rank cannot read makes an "unreadable" fact, so the ranks still meet
    in the collective; when every rank fails alike, they agree, and the loader then
    reports the problem itself.
    """
    try:
        config = Fact(CONFIG, read_config_text(folder / CONFIG), "", SAME_CHECKPOINT)
    except _READ_ERRORS as exc:
        config = _unreadable(CONFIG, exc)
    try:
        layout_digest, weights_digest, tensors = _tensor_digests(folder)
        layout = Fact(LAYOUT, layout_digest, f"{tensors} tensors", SAME_CHECKPOINT)
        weights = Fact(WEIGHTS, weights_digest, "", SAME_CHECKPOINT)
    except _READ_ERRORS as exc:
        layout, weights = _unreadable(LAYOUT, exc), _unreadable(WEIGHTS, exc)
    versions = (
        f"slotwise {slotwise_version}, slotwise-engine {_version('slotwise-engine')}, "
        f"torch {torch.__version__}"
    )
    return [config, layout, weights, Fact(VERSIONS, versions.encode(), versions, SAME_VERSIONS)]


def _unreadable(name: str, error: Exception) -> Fact:
    # The kind of error only, not its text: ranks failing alike on other paths agree.
    return Fact(name, f"unreadable: {type(error).__name__}".encode(), "unreadable", SAME_CHECKPOINT)


def _tensor_digests(folder: Path) -> tuple[bytes, bytes, int]:
    """The sha256 of the files' headers, that of the sampled tensor bytes, and the
    number of tensors."""
    with Checkpoint(folder) as checkpoint:  # the files the loader opens, checked
        names = sorted({path.name for path in checkpoint.files.values()})
        tensors = len(checkpoint.files)
    layout, weights = hashlib.sha256(), hashlib.sha256()
    for name in names:
        header, samples = _read_file(folder, name)
        layout.update(f"{name}\0{len(header)}\0".encode() + header)
        weights.update(samples)
    return layout.digest(), weights.digest(), tensors


def _read_file(folder: Path, name: str) -> tuple[bytes, bytes]:
    """The header of safetensors file ``name`` and the sampled bytes of its tensors."""
    descriptor = os.open(model_file(folder, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        length = int.from_bytes(os.pread(descriptor, 8, 0), "little")
        if length > HEADER_LIMIT:
            raise ValueError(f"{name}: a header of {length} bytes")
        header = os.pread(descriptor, length, 8)
        start = 8 + length
        spans = sorted(
            tuple(entry["data_offsets"])
            for key, entry in json.loads(header).items()
            if key != "__metadata__"
        )
        samples = bytearray()
        for begin, end in spans:
            for offset in (begin, begin + (end - begin) // 2):
                samples += os.pread(descriptor, min(SAMPLE_BYTES, end - offset), start + offset)
        return header, bytes(samples)
    finally:
        os.close(descriptor)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
