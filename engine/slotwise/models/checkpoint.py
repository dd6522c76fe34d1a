"""The safetensors files of a checkpoint folder, read tensor by tensor, slice by slice.

A folder holds ``model.safetensors``, or shards ``model-XXXXX-of-YYYYY.safetensors``
listed by ``model.safetensors.index.json``.  Each file is opened with safetensors'
``safe_open``, which memory-maps it and parses only its header; a tensor's bytes
are read when a slice of it is indexed, so a tensor-parallel rank that indexes its
rows or columns reads just those.  Opening checks every header, so a truncated or
corrupt file fails before any weight is read.  Every file must be a regular file of
the model (:func:`slotwise.models.model_files.model_file`): a shard linked to a
device or to a file elsewhere is refused before it is mapped.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from slotwise.models.errors import CheckpointError
from slotwise.models.model_files import JSON_LIMIT, model_file, read_model_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: safetensors dtype codes of the weights slotwise loads (converted to the model's dtype).
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


class CheckpointTensor:
    """One tensor of the checkpoint; indexing it reads (and counts) only those bytes."""

    def __init__(self, checkpoint: Checkpoint, name: str, view: Any) -> None:
        self.checkpoint = checkpoint
        self.name = name
        self.file = checkpoint.files[name]
        self._view = view
        self.shape = tuple(view.get_shape())
        self.dtype = view.get_dtype()

    def __getitem__(self, index: Any) -> torch.Tensor:
        tensor = self._view[index]
        self.checkpoint.bytes_read += tensor.numel() * tensor.element_size()
        return tensor


class Checkpoint:
    """The open files of one checkpoint; use as a context manager to close them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        #: Tensor name -> the file holding it.
        self.files: dict[str, Path] = {}
        #: Bytes of tensor data read so far (file bytes, before any dtype conversion).
        self.bytes_read = 0
        self._handles: dict[Path, Any] = {}
        self._stack = ExitStack()
        try:
            for file, names in self._layout().items():
                self._open(file, names)
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def tensor(self, name: str) -> CheckpointTensor:
        return CheckpointTensor(self, name, self._handles[self.files[name]].get_slice(name))

    def _layout(self) -> dict[str, list[str] | None]:
        """Each file to open, by its name in the folder, and the tensors the index places
        in it (None: all of them)."""
        index = self.folder / INDEX_FILE
        if os.path.lexists(index):
            return self._read_index(index)
        single = self.folder / SINGLE_FILE
        if os.path.lexists(single):
            return {SINGLE_FILE: None}
        found = sorted(
            p.name for p in self.folder.iterdir() if p.suffix in (".safetensors", ".bin")
        )
        hint = f"; found {', '.join(found)}" if found else ""
        raise CheckpointError(
            f"{self.folder}: neither {SINGLE_FILE} nor {INDEX_FILE}{hint}; slotwise reads "
            "safetensors checkpoints (save_pretrained writes them; convert *.bin files first)"
        )

    def _read_index(self, index: Path) -> dict[str, list[str] | None]:
        data = read_model_file(self.folder, INDEX_FILE, limit=JSON_LIMIT)
        try:
            weight_map = json.loads(data)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
            if not all(isinstance(file, str) for file in weight_map.values()):
                raise TypeError("a shard name is not a string")
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CheckpointError(
                f"{index}: not a safetensors index ({type(exc).__name__}: {exc}); it must be "
                'JSON with a "weight_map" from tensor names to shard files; save it again'
            ) from exc
        layout: dict[str, list[str] | None] = {}
        for name, file in weight_map.items():
            if not os.path.lexists(self.folder / file):
                raise CheckpointError(
                    f"{index}: names shard {file} (for tensor {name}), which is not in "
                    f"{self.folder}; download the missing shard or save the checkpoint again"
                )
            names = layout.setdefault(file, [])
            assert names is not None
            names.append(name)
        return layout

    def _open(self, file: str, names: list[str] | None) -> None:
        path = self.folder / file
        target = model_file(self.folder, file)  # memory-mapped: no size limit
        try:
            handle = self._stack.enter_context(safe_open(target, framework="pt"))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(
                f"{path}: not a readable safetensors file ({exc}); it is truncated or "
                "corrupt: download or save it again"
            ) from exc
        keys = set(handle.keys())
        for name in names if names is not None else sorted(keys):
            if name not in keys:
                raise CheckpointError(
                    f"{path}: lacks tensor {name}, which {INDEX_FILE} places there; the "
                    "index and the shards disagree: download or save the checkpoint again"
                )
            self.files[name] = path
        self._handles[path] = handle
