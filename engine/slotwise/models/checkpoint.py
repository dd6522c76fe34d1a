"""The safetensors files of a checkpoint folder, read tensor by tensor, slice by slice.

A folder holds ``model.safetensors``, or shards ``model-XXXXX-of-YYYYY.safetensors``
listed by ``model.safetensors.index.json``.  A safetensors file is an 8-byte header
length, a JSON header giving each tensor's dtype, shape and byte range, then the
tensors' bytes.  Opening a checkpoint reads and checks every header, so a truncated or
corrupt file fails before any weight is read.  Every file must be a regular file of
the model (:func:`slotwise.models.model_files.open_model_file`): a shard linked to a
device or to a file elsewhere is refused before it is read.

The files are read with ``pread`` from descriptors held open while the checkpoint is,
never memory-mapped: a mapped file that another process truncates kills the reader
with SIGBUS, which no Python code can catch, where a read that comes up short is one
CheckpointError naming the file.  Indexing a tensor reads only the bytes of that
slice: a tensor-parallel rank that indexes its rows or columns reads just those, each
tensor through one temporary buffer of the slice's size, which its parameter then
copies.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slotwise.models.errors import CheckpointError
from slotwise.models.model_files import (
    JSON_LIMIT,
    model_file_exists,
    open_model_file,
    read_model_json,
)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: safetensors dtype codes of the weights slotwise loads (converted to the model's dtype).
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
_TORCH_DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
}
#: Bits per element of every dtype code of the safetensors format, so any valid file's
#: header can be checked, quantized ones included.
_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
#: The largest header the safetensors library reads.
HEADER_LIMIT = 100_000_000
#: Bytes between the runs of a slice (a column slice's rows) from which each run is read
#: on its own; closer runs are read with the bytes between them, which share their pages.
_PAGE = 4096
#: Bytes of whole rows read at a time, into one reused buffer, for a slice of close runs.
_BLOCK_BYTES = 8 << 20


class CheckpointTensor:
    """One tensor of the checkpoint; indexing it reads (and counts) only those bytes."""

    def __init__(self, checkpoint: Checkpoint, name: str) -> None:
        self.checkpoint = checkpoint
        self.name = name
        self.file = checkpoint.files[name]
        self._entry = checkpoint._entries[name]
        self.shape = self._entry.shape
        self.dtype = self._entry.dtype

    def __getitem__(self, index: Any) -> torch.Tensor:
        """The slice ``index`` (slices with step 1 and ``...``) as a new tensor."""
        bounds = _bounds(index, self.shape)
        dtype = _TORCH_DTYPES.get(self.dtype)
        if dtype is None:
            raise CheckpointError(
                f"{self.file}: tensor {self.name} is stored as {self.dtype}; slotwise reads "
                f"unquantized floating-point weights ({', '.join(FLOAT_DTYPES)})"
            )
        tensor = _cpu_tensor([stop - start for start, stop in bounds], dtype)
        if tensor.numel():
            self._fill(tensor, bounds)
        self.checkpoint.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def _fill(self, tensor: torch.Tensor, bounds: list[tuple[int, int]]) -> None:
        """Read the slice ``bounds`` into ``tensor``.

        The slice is made of runs of contiguous bytes, each spanning the last dimension
        it does not take whole and all after it.  One run is read straight into
        ``tensor``; runs a page or more apart (a tensor-parallel rank's columns of wide
        rows) each straight into its place, so only their pages are read; runs closer
        than that (columns of narrow rows) through whole rows, a block at a time.
        """
        read = self.checkpoint._read
        item = tensor.element_size()
        strides = [item * math.prod(self.shape[d + 1 :]) for d in range(len(self.shape))]
        inner = max(
            (d for d, (start, stop) in enumerate(bounds) if stop - start != self.shape[d]),
            default=0,
        )
        base = self._entry.begin + sum(
            start * stride for (start, _), stride in zip(bounds, strides, strict=True)
        )
        if inner == 0:
            read(self, _bytes_of(tensor), base)
            return
        run = (bounds[inner][1] - bounds[inner][0]) * strides[inner]
        if strides[inner - 1] - run >= _PAGE:
            target, filled = _bytes_of(tensor), 0
            outer = [range(stop - start) for start, stop in bounds[:inner]]
            for position in itertools.product(*outer):
                offset = sum(i * s for i, s in zip(position, strides[:inner], strict=True))
                read(self, target[filled : filled + run], base + offset)
                filled += run
            return
        first, last = bounds[0]
        rows = min(last - first, max(1, _BLOCK_BYTES // strides[0]))
        block = _cpu_tensor([rows, *self.shape[1:]], tensor.dtype)
        inside = (slice(None), *(slice(start, stop) for start, stop in bounds[1:]))
        for row in range(first, last, rows):
            part = block[: min(rows, last - row)]
            read(self, _bytes_of(part), self._entry.begin + row * strides[0])
            tensor[row - first : row - first + len(part)].copy_(part[inside])


def _cpu_tensor(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    # On the CPU whatever the default device: the file is read into its memory.
    return torch.empty(shape, dtype=dtype, device="cpu")


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The memory of the contiguous CPU tensor ``tensor``, writable, as bytes."""
    size = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * size).from_address(tensor.data_ptr())).cast("B")


@dataclass(frozen=True)
class _Entry:
    """One tensor of a file's header; ``begin`` and ``end`` are offsets in the file."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class Checkpoint:
    """The open files of one checkpoint; use as a context manager to close them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        #: Tensor name -> the file holding it.
        self.files: dict[str, Path] = {}
        #: Bytes of tensor data read so far (file bytes, before any dtype conversion).
        self.bytes_read = 0
        self._entries: dict[str, _Entry] = {}
        self._descriptors: dict[Path, int] = {}
        self._stack = ExitStack()
        # Closed descriptors are forgotten: their numbers may name other files later.
        self._stack.callback(self._descriptors.clear)
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
        return CheckpointTensor(self, name)

    def _layout(self) -> dict[str, list[str] | None]:
        """Each file to open, by its name in the folder, and the tensors the index places
        in it (None: all of them)."""
        if model_file_exists(self.folder, INDEX_FILE):
            return self._read_index(self.folder / INDEX_FILE)
        if model_file_exists(self.folder, SINGLE_FILE):
            return {SINGLE_FILE: None}
        try:
            found = sorted(
                p.name for p in self.folder.iterdir() if p.suffix in (".safetensors", ".bin")
            )
        except OSError:  # the folder cannot be listed: the message lacks only the hint
            found = []
        hint = f"; found {', '.join(found)}" if found else ""
        raise CheckpointError(
            f"{self.folder}: neither {SINGLE_FILE} nor {INDEX_FILE}{hint}; slotwise reads "
            "safetensors checkpoints (save_pretrained writes them; convert *.bin files first)"
        )

    def _read_index(self, index: Path) -> dict[str, list[str] | None]:
        data = read_model_json(self.folder, INDEX_FILE, limit=JSON_LIMIT)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(file, str) and file and "\0" not in file for file in weight_map.values()
        ):
            raise CheckpointError(
                f'{index}: not a safetensors index; it must be JSON with a "weight_map" '
                "from tensor names to shard file names: save it again"
            )
        layout: dict[str, list[str] | None] = {}
        for name, file in weight_map.items():
            if not model_file_exists(self.folder, file):
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
        descriptor = open_model_file(self.folder, file)
        self._stack.callback(os.close, descriptor)
        entries = _read_header(descriptor, path)
        for name in names if names is not None else sorted(entries):
            if name not in entries:
                raise CheckpointError(
                    f"{path}: lacks tensor {name}, which {INDEX_FILE} places there; the "
                    "index and the shards disagree: download or save the checkpoint again"
                )
            self.files[name] = path
            self._entries[name] = entries[name]
        self._descriptors[path] = descriptor

    def _read(self, tensor: CheckpointTensor, target: memoryview, offset: int) -> None:
        """Fill ``target`` from byte ``offset`` of the file of ``tensor``; a file that
        ends first is an error, not a tensor with a tail of garbage."""
        descriptor = self._descriptors.get(tensor.file)
        if descriptor is None:
            raise ValueError(f"{tensor.file}: {tensor.name} read after the checkpoint closed")
        while target:
            try:
                count = os.preadv(descriptor, [target], offset)
            except OSError as exc:
                raise CheckpointError(
                    f"{tensor.file}: reading tensor {tensor.name} failed "
                    f"({exc.strerror or exc}); check the disk, or download the file again"
                ) from exc
            if count == 0:
                raise CheckpointError(
                    f"{tensor.file}: ends at byte {offset:,}, inside tensor {tensor.name}, "
                    "although its header was checked when the checkpoint was opened: the file "
                    "was truncated or replaced while slotwise read it; load it again once "
                    "nothing writes to it"
                )
            target, offset = target[count:], offset + count


def _read_header(descriptor: int, path: Path) -> dict[str, _Entry]:
    """Every tensor the header of the safetensors file ``path`` declares, checked as
    the safetensors library checks it: known dtypes, byte ranges that match the shapes
    and that tile the data exactly to the end of the file."""
    size = os.fstat(descriptor).st_size

    def corrupt(reason: str) -> CheckpointError:
        return CheckpointError(
            f"{path}: not a readable safetensors file ({reason}); it is truncated or "
            "corrupt: download or save it again"
        )

    def read(length: int, offset: int) -> bytes:
        try:
            return os.pread(descriptor, length, offset)
        except OSError as exc:
            raise CheckpointError(
                f"{path}: reading its header failed ({exc.strerror or exc}); check the disk, "
                "or download the file again"
            ) from exc

    prefix = read(8, 0)
    if len(prefix) < 8:
        raise corrupt(f"{size} bytes, shorter than the header's 8-byte length")
    header_size = int.from_bytes(prefix, "little")
    if header_size > HEADER_LIMIT:
        raise corrupt(f"a header of {header_size:,} bytes, over the {HEADER_LIMIT:,} allowed")
    if 8 + header_size > size:
        raise corrupt(f"a header of {header_size:,} bytes in a file of {size:,}")
    text = read(header_size, 8)
    try:
        header = _json_object(text)
    except ValueError as exc:  # also an integer past the digit limit, or bad UTF-8
        raise corrupt(f"its header is not a JSON object: {str(exc).partition(';')[0]}") from None
    except RecursionError:
        raise corrupt("its header is nested too deeply") from None
    data_start = 8 + header_size
    entries = {}
    for name, fields in header.items():
        if name == "__metadata__":
            if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
                raise corrupt("__metadata__ is not an object of strings")
            continue
        problem = _entry_problem(fields)
        if problem:
            raise corrupt(f"tensor {name} {problem}")
        begin, end = fields["data_offsets"]
        entries[name] = _Entry(
            fields["dtype"], tuple(fields["shape"]), data_start + begin, data_start + end
        )
    end = data_start
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != end:
            raise corrupt(
                f"tensor {name} starts at data byte {entry.begin - data_start:,}, not at "
                f"{end - data_start:,} where the tensor before it ends"
            )
        end = entry.end
    if end != size:
        raise corrupt(
            f"its tensors end at byte {end:,} and the file at byte {size:,}"
            + ("; it is shorter than its header says" if size < end else "")
        )
    return entries


def _json_object(text: bytes) -> dict[str, Any]:
    value = json.loads(text.decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def _entry_problem(fields: Any) -> str | None:
    """What is wrong with one tensor's header entry, or None."""
    if not isinstance(fields, dict):
        return "is not an object"
    dtype, shape, offsets = fields.get("dtype"), fields.get("shape"), fields.get("data_offsets")
    if dtype not in _DTYPE_BITS:
        return f"has an unknown dtype {str(dtype)[:20]!r}"
    if not _naturals(shape):
        return "has a shape that is not a list of sizes"
    if not _naturals(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        return "has data_offsets that are not a [begin, end] pair"
    bits = math.prod(shape) * _DTYPE_BITS[dtype]
    if bits % 8 or offsets[1] - offsets[0] != bits // 8:
        return (
            f"of shape {shape} and dtype {dtype} spans {offsets[1] - offsets[0]:,} bytes, "
            "not the bytes its shape needs"
        )
    return None


def _naturals(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value
    )


def _bounds(index: Any, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """(start, stop) per dimension of ``index``: slices with step 1, and one ``...``."""
    items = list(index) if isinstance(index, tuple) else [index]
    if items.count(Ellipsis) > 1 or not all(
        item is Ellipsis or isinstance(item, slice) for item in items
    ):
        raise TypeError(f"checkpoint tensors take slices with step 1 and '...', not {index!r}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    if len(items) > len(shape):
        raise TypeError(f"{index!r} indexes {len(items)} dimensions of a {len(shape)}-d tensor")
    items += [slice(None)] * (len(shape) - len(items))
    bounds = []
    for item, size in zip(items, shape, strict=True):
        start, stop, step = item.indices(size)
        if step != 1:
            raise TypeError(f"checkpoint tensors take slices with step 1, not {index!r}")
        bounds.append((start, max(start, stop)))
    return bounds
