"""The safetensors files of a checkpoint folder, read tensor by tensor, slice by slice.

A folder holds ``model.safetensors``, or shards ``model-XXXXX-of-YYYYY.safetensors``
listed by ``model.safetensors.index.json``.  A safetensors file is an 8-byte header
length, a JSON header giving each tensor's dtype, shape and byte range, then the
tensors' bytes.  Opening a checkpoint reads and checks every header, so a truncated or
corrupt file fails before any weight is read.  Every file must be a regular file of
the model (:func:`slotwise_engine.models.model_files.open_model_file`): a shard linked to a
device or to a file elsewhere is refused before it is read.

The files are read with ``pread`` from descriptors held open while the checkpoint is,
never memory-mapped: a mapped file that another process truncates kills the reader
with SIGBUS, which no Python code can catch, where a read that comes up short is one
CheckpointError naming the file.  Reading a slice reads only its bytes: a
tensor-parallel rank reads just its rows or columns.  ``CheckpointTensor.copy_to``
reads a slice straight into its parameter's memory, so each byte is copied once, as
from a memory map; columns of narrow rows (read in blocks of whole rows) and a
parameter on another device or of another dtype go through one small staging buffer.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slotwise_engine.models.errors import CheckpointError
from slotwise_engine.models.model_files import (
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
#: Runs of a slice (a column slice's rows) closer than this many bytes are read in
#: blocks of whole rows, the bytes between them included, and the slice copied out:
#: cheaper than a system call per run; runs farther apart are each read on their own.
_CLOSE_GAP = 8 << 10
#: Size of the one staging buffer: the blocks of close runs, and the blocks of rows
#: through which a destination on another device or of another dtype is filled.
_STAGING_BYTES = 2 << 20


class CheckpointTensor:
    """One tensor of the checkpoint; reading a slice of it reads (and counts) only the
    slice's bytes."""

    def __init__(self, checkpoint: Checkpoint, name: str) -> None:
        self.checkpoint = checkpoint
        self.name = name
        self.file = checkpoint.files[name]
        self._entry = checkpoint._entries[name]
        self.shape = self._entry.shape
        self.dtype = self._entry.dtype

    def __getitem__(self, index: Any) -> torch.Tensor:
        """The slice ``index`` (slices with step 1 and ``...``) as a new CPU tensor."""
        bounds = _bounds(index, self.shape)
        tensor = _cpu_tensor([stop - start for start, stop in bounds], self._torch_dtype())
        self._copy(tensor, bounds)
        self.checkpoint.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def copy_to(self, dest: torch.Tensor, index: Any = None) -> None:
        """Copy the slice ``index`` (as for indexing; None: the whole tensor) into
        ``dest``, a tensor of the slice's shape, with no copy of the slice on the way.

        A contiguous CPU ``dest`` of the file's dtype is read into directly; any other
        (on another device, of another dtype or layout), and a slice of columns of
        narrow rows, is filled from a staging buffer of ``_STAGING_BYTES``, a block of
        rows at a time, so no memory of the slice's size is taken.
        """
        bounds = _bounds(... if index is None else index, self.shape)
        dtype = self._torch_dtype()
        sizes = [stop - start for start, stop in bounds]
        if list(dest.shape) != sizes:
            raise ValueError(
                f"{self.name}: a slice of shape {sizes} cannot be copied into a tensor of "
                f"shape {list(dest.shape)}"
            )
        with torch.no_grad():
            self._copy(dest, bounds)
        self.checkpoint.bytes_read += dest.numel() * dtype.itemsize

    def _torch_dtype(self) -> torch.dtype:
        dtype = _TORCH_DTYPES.get(self.dtype)
        if dtype is None:
            raise CheckpointError(
                f"{self.file}: tensor {self.name} is stored as {self.dtype}; slotwise reads "
                f"unquantized floating-point weights ({', '.join(FLOAT_DTYPES)})"
            )
        return dtype

    def _copy(self, dest: torch.Tensor, bounds: list[tuple[int, int]]) -> None:
        """Fill ``dest`` with the slice ``bounds``.

        The slice is made of runs of contiguous bytes, each spanning the last dimension
        it does not take whole and all after it.  Runs close together (columns of
        narrow rows) are read in blocks of whole rows into the staging buffer, which
        ``dest`` copies them from; otherwise a contiguous CPU ``dest`` of the file's
        dtype is read into directly, and any other through the staging buffer.
        """
        dtype = _TORCH_DTYPES[self.dtype]
        if not dest.numel():
            return
        layout = _Layout(self, bounds)
        if layout.gaps and max(layout.gaps) < _CLOSE_GAP and layout.span <= _STAGING_BYTES:
            self._copy_rows(dest, layout)
        elif dest.device.type == "cpu" and dest.dtype == dtype and dest.is_contiguous():
            self._read_runs(dest, layout)
        else:
            self._copy_staged(dest, bounds, dtype, ())

    def _read_runs(self, tensor: torch.Tensor, layout: _Layout) -> None:
        """Read the runs of ``layout`` into the contiguous CPU ``tensor``, one call each."""
        target, read, run = _bytes_of(tensor), self.checkpoint._read, layout.run
        for filled, offset in zip(range(0, len(target), run), layout.offsets(), strict=True):
            read(self, target[filled : filled + run], offset)

    def _copy_rows(self, dest: torch.Tensor, layout: _Layout) -> None:
        """Fill ``dest`` with a slice of close runs: as many rows at a time as the
        staging buffer holds are read whole, the gaps between runs included, and the
        slice is copied out of them."""
        dtype = _TORCH_DTYPES[self.dtype]
        rows, row_stride = layout.sizes[0], layout.strides[0]
        step = (_STAGING_BYTES - layout.span) // row_stride + 1
        elements = [stride // dtype.itemsize for stride in layout.strides]
        for first in range(0, rows, step):
            count = min(step, rows - first)
            staged = self.checkpoint._staging(torch.uint8, [(count - 1) * row_stride + layout.span])
            self.checkpoint._read(self, _bytes_of(staged), layout.base + first * row_stride)
            rows_read = staged.view(dtype).as_strided([count, *layout.sizes[1:]], elements)
            dest[first : first + count].copy_(rows_read)

    def _copy_staged(
        self,
        dest: torch.Tensor,
        bounds: list[tuple[int, int]],
        dtype: torch.dtype,
        fixed: tuple[tuple[int, int], ...],
    ) -> None:
        """Fill ``dest`` with the slice ``bounds`` of the dimensions after those ``fixed``
        picks one index of, through the staging buffer: as many whole rows of the first
        dimension at a time as it holds, or each row on its own where one is larger."""
        if not bounds:  # a scalar
            staged = self.checkpoint._staging(dtype, [])
            self._read_runs(staged, _Layout(self, list(fixed)))
            dest.copy_(staged)
            return
        (first, last), inner = bounds[0], bounds[1:]
        row = [stop - start for start, stop in inner]
        rows = _STAGING_BYTES // (dtype.itemsize * math.prod(row))
        if rows == 0:
            for i in range(first, last):
                self._copy_staged(dest[i - first], inner, dtype, (*fixed, (i, i + 1)))
            return
        for start in range(first, last, rows):
            stop = min(start + rows, last)
            staged = self.checkpoint._staging(dtype, [stop - start, *row])
            self._read_runs(staged, _Layout(self, [*fixed, (start, stop), *inner]))
            dest[start - first : stop - first].copy_(staged)


class _Layout:
    """Where the bytes of one slice of a tensor lie in its file: runs of ``run``
    contiguous bytes (each spanning the last dimension the slice does not take whole
    and all after it), the first at ``base``; ``gaps``, the bytes between runs, one per
    dimension the slice steps through; ``span``, the bytes from the first of a row's
    runs (of the first dimension) to the end of its last."""

    def __init__(self, tensor: CheckpointTensor, bounds: list[tuple[int, int]]) -> None:
        itemsize = _TORCH_DTYPES[tensor.dtype].itemsize
        shape = tensor.shape
        self.sizes = [stop - start for start, stop in bounds]
        self.strides = [itemsize * math.prod(shape[d + 1 :]) for d in range(len(shape))]
        self.base = tensor._entry.begin + sum(
            start * stride for (start, _), stride in zip(bounds, self.strides, strict=True)
        )
        self.inner = max((d for d, size in enumerate(self.sizes) if size != shape[d]), default=0)
        self.run = itemsize * math.prod(self.sizes[self.inner :])
        self.gaps: list[int] = []
        span = self.run
        for d in reversed(range(self.inner)):
            if self.sizes[d] > 1:
                self.gaps.append(self.strides[d] - span)
                if d:
                    span += (self.sizes[d] - 1) * self.strides[d]
        self.span = span

    def offsets(self) -> list[int]:
        """The file offset of every run, in the slice's order."""
        offsets = [self.base]
        for d in range(self.inner):
            offsets = [o + i * self.strides[d] for o in offsets for i in range(self.sizes[d])]
        return offsets


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
        self._staging_buffer: torch.Tensor | None = None
        self._stack = ExitStack()
        # Closed descriptors are forgotten: their numbers may name other files later.
        self._stack.callback(self._descriptors.clear)
        self._stack.callback(setattr, self, "_staging_buffer", None)
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

    def _staging(self, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        """A tensor of ``shape`` (at most ``_STAGING_BYTES``) in the one staging buffer,
        allocated on first use and reused, so its pages are faulted in once."""
        if self._staging_buffer is None:
            self._staging_buffer = _cpu_tensor([_STAGING_BYTES], torch.uint8)
        size = math.prod(shape) * dtype.itemsize
        return self._staging_buffer[:size].view(dtype).view(shape)

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
