"""Checkpoint tensors are read from file descriptors, slice by slice, as the safetensors
library reads them, indexed or copied straight into a destination tensor; a header that
library refuses is refused with one error naming the file.  The library is the oracle:
slotwise does not memory-map the files, so a file cut short under it is an error, not
SIGBUS (tests/cli/test_generate_file_errors.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from slotwise_engine.models import CheckpointError
from slotwise_engine.models import checkpoint as checkpoint_module
from slotwise_engine.models.checkpoint import Checkpoint

pytestmark = pytest.mark.usefixtures("never_hang")

#: name -> tensor: narrow and wide rows (column slices whose runs lie closer or farther
#: apart than the gap read through), three dimensions, a scalar, an empty tensor, each
#: float dtype.
TENSORS = {
    "narrow": torch.arange(37 * 53, dtype=torch.float32).reshape(37, 53).to(torch.bfloat16),
    "wide": torch.arange(64 * 3000, dtype=torch.float32).reshape(64, 3000).half(),
    "wider": torch.arange(16 * 6000, dtype=torch.float64).reshape(16, 6000),
    "cube": torch.arange(4 * 3 * 2048, dtype=torch.float32).reshape(4, 3, 2048),
    "scalar": torch.tensor(3.5, dtype=torch.float64),
    "empty": torch.empty(0, 4),
    "vector": torch.arange(11, dtype=torch.float32),
}
SLICES = [
    (slice(None),),
    (slice(3, 9),),
    (slice(None), slice(10, 20)),
    (slice(None), slice(1500, 3000)),
    (slice(1, None), slice(None, -1)),
    (slice(5, 5),),
    (Ellipsis, slice(1, 2)),
    (slice(1, 3), slice(1, 2)),
    (slice(None), slice(None), slice(0, 10)),
    (slice(1, 3), slice(0, 2), slice(5, 2000)),
    (slice(2, 3), slice(1, None), slice(None, 7)),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tensors")
    save_file(TENSORS, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("name", TENSORS)
def test_every_slice_equals_what_safetensors_reads(folder, name):
    with Checkpoint(folder) as checkpoint, safe_open(folder / "model.safetensors", "pt") as file:
        ours, theirs = checkpoint.tensor(name), file.get_slice(name)
        assert ours.shape == tuple(theirs.get_shape()) and ours.dtype == theirs.get_dtype()
        for index in (index for index in SLICES if fits(index, name)):
            expected = theirs[index]
            got = ours[index]
            assert got.dtype == expected.dtype and torch.equal(got, expected), index


def fits(index: tuple, name: str) -> bool:
    return len([i for i in index if i is not Ellipsis]) <= TENSORS[name].dim()


def destination(shape: torch.Size, dtype: torch.dtype, kind: str) -> torch.Tensor:
    """A tensor of ``shape`` to copy into, filled with NaN so an unwritten element shows."""
    if kind == "contiguous":
        return torch.full(shape, float("nan"), dtype=dtype)
    if kind == "float64":
        return torch.full(shape, float("nan"), dtype=torch.float64)
    # Every other element of a wider tensor: strided, not contiguous.
    return torch.full([*shape, 2], float("nan"), dtype=dtype)[..., 0]


#: Bytes of the staging buffer: the default, and a few rows, so that a slice is copied
#: in many blocks and a row larger than the buffer one by one.
STAGING = [None, 256]


@pytest.mark.parametrize("staging", STAGING, ids=["default staging", "small staging"])
@pytest.mark.parametrize("kind", ["contiguous", "float64", "strided"])
@pytest.mark.parametrize("name", TENSORS)
def test_copy_to_writes_what_safetensors_reads(folder, monkeypatch, name, kind, staging):
    if staging is not None:
        monkeypatch.setattr(checkpoint_module, "_STAGING_BYTES", staging)
    with Checkpoint(folder) as checkpoint, safe_open(folder / "model.safetensors", "pt") as file:
        ours, theirs = checkpoint.tensor(name), file.get_slice(name)
        for index in [None, *(index for index in SLICES if fits(index, name))]:
            expected = theirs[...] if index is None else theirs[index]
            dest = destination(expected.shape, expected.dtype, kind)
            ours.copy_to(dest, index)
            assert torch.equal(dest, expected.to(dest.dtype)), index


def test_copy_to_counts_the_bytes_of_the_slice_in_the_files_dtype(folder):
    with Checkpoint(folder) as checkpoint:
        checkpoint.tensor("wide").copy_to(
            torch.empty(64, 100, dtype=torch.float64), (..., slice(0, 100))
        )
        checkpoint.tensor("cube").copy_to(torch.empty(1, 3, 2048), slice(1, 2))
        assert checkpoint.bytes_read == 64 * 100 * 2 + 3 * 2048 * 4


def test_copy_to_a_tensor_of_another_shape_is_refused(folder):
    with Checkpoint(folder) as checkpoint:
        dest = torch.zeros(64, 11)
        with pytest.raises(ValueError, match=r"wide: a slice of shape \[64, 10\] cannot be"):
            checkpoint.tensor("wide").copy_to(dest, (slice(None), slice(0, 10)))
        assert not dest.any()


def test_the_bytes_read_are_those_of_the_slices(folder):
    with Checkpoint(folder) as checkpoint:
        checkpoint.tensor("wide")[:, 100:200]
        checkpoint.tensor("cube")[1:2]
        assert checkpoint.bytes_read == 64 * 100 * 2 + 3 * 2048 * 4


def test_a_tensor_on_the_default_device_is_read_into_the_cpus_memory(folder):
    with torch.device("meta"), Checkpoint(folder) as checkpoint:
        tensor = checkpoint.tensor("vector")[:]
    assert tensor.device.type == "cpu" and torch.equal(tensor, TENSORS["vector"])


def header_of(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def write(path: Path, header: dict | str, data: bytes) -> None:
    text = header if isinstance(header, str) else json.dumps(header)
    path.write_bytes(struct.pack("<Q", len(text)) + text.encode() + data)


def corrupt(header: dict, data: bytes, change: str) -> tuple[dict | str, bytes]:
    if change == "unknown dtype":
        header["vector"]["dtype"] = "F12"
    elif change == "offsets unlike the shape":
        header["vector"]["shape"] = [12]
    elif change == "a gap between tensors":
        begin, end = header["vector"]["data_offsets"]
        header["vector"]["data_offsets"] = [begin + 4, end + 4]
        data += b"\0" * 4
    elif change == "bytes after the tensors":
        data += b"\0" * 8
    elif change == "data cut short":
        data = data[:-8]
    elif change == "metadata of numbers":
        header["__metadata__"] = {"format": 1}
    elif change == "not an object":
        return "[1, 2]", data
    elif change == "not JSON":
        return '{"vector": ', data
    elif change == "a negative size":
        header["vector"]["shape"] = [-11]
    return header, data


@pytest.mark.parametrize(
    "change",
    [
        "unknown dtype",
        "offsets unlike the shape",
        "a gap between tensors",
        "bytes after the tensors",
        "data cut short",
        "metadata of numbers",
        "not an object",
        "not JSON",
        "a negative size",
    ],
)
def test_a_header_safetensors_refuses_is_refused_naming_the_file(folder, tmp_path, change):
    header, data = header_of(folder / "model.safetensors")
    path = tmp_path / "model.safetensors"
    write(path, *corrupt(header, data, change))
    with pytest.raises(SafetensorError):
        safe_open(path, "pt")
    with pytest.raises(CheckpointError) as caught:
        Checkpoint(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{path}: not a readable safetensors file (")
    assert message.endswith("it is truncated or corrupt: download or save it again")


@pytest.mark.parametrize("size", [0, 5, 8 + 100])
def test_a_file_shorter_than_its_header_is_refused(tmp_path, size):
    path = tmp_path / "model.safetensors"
    path.write_bytes((1000).to_bytes(8, "little").ljust(size, b" ")[:size])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        Checkpoint(tmp_path)
