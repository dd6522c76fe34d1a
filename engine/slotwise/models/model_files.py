"""The files of a model folder, read only when they are regular files of that model.

A checkpoint comes from a download, and any of its names can be a symlink, a device
or a FIFO: read blindly, a ``chat_template.jinja`` linked to ``/proc/self/environ``
becomes the prompt, a ``tokenizer.json`` linked to ``/dev/zero`` fills the memory
and one that is a FIFO blocks forever.  A name is accepted when it resolves to a
regular file inside the model folder or, for a snapshot of the Hugging Face cache
(``.../snapshots/<revision>/``), to a blob of the same repository
(``.../blobs/<hash>``): the links the hub client makes.  Each kind of file has a
size limit, checked on the open descriptor, so a file swapped or grown after the
checks is refused all the same.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slotwise.models.errors import CheckpointError

MIB = 1 << 20
#: Size limits by kind of file, far above the largest published file of each kind
#: (Llama 3's tokenizer.json is 9 MB, the longest chat templates some 30 kB).
JSON_LIMIT = 64 * MIB  # config.json, tokenizer_config.json, the safetensors index, ...
TOKENIZER_LIMIT = 256 * MIB  # tokenizer.json
TEMPLATE_LIMIT = 1 * MIB  # chat_template.jinja

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def model_file(folder: Path, name: str) -> Path:
    """The real path of ``folder / name``, once it is known to be a regular file of the
    model (for files slotwise memory-maps, such as safetensors files)."""
    path = Path(folder) / name
    try:
        target = Path(os.path.realpath(path, strict=True))
    except FileNotFoundError:
        raise CheckpointError(_missing(path)) from None
    except OSError as exc:  # a symlink loop, a folder that cannot be searched
        raise CheckpointError(
            f"{path}: cannot be resolved ({exc.strerror}); replace it with the file itself"
        ) from exc
    if not _belongs(target, Path(os.path.realpath(folder))):
        raise CheckpointError(
            f"{path}: resolves to {target}, outside the model folder {folder}; slotwise reads "
            "a model's files only from its folder (or from the Hugging Face cache's blobs of "
            "the same model): replace the link with a copy of the file it stands for"
        )
    _require_regular(path, target, os.stat(target).st_mode)
    return target


def read_model_file(folder: Path, name: str, *, limit: int) -> bytes:
    """The bytes of ``folder / name``, a regular file of the model of at most ``limit``
    bytes.  Opened non-blocking, so a FIFO swapped in after the checks never blocks."""
    path = Path(folder) / name
    target = model_file(folder, name)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(target, flags)
    except OSError as exc:
        raise CheckpointError(
            f"{path}: cannot be opened ({exc.strerror}); make it readable or download it again"
        ) from exc
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(descriptor)
        _require_regular(path, target, status.st_mode)
        if status.st_size > limit:
            raise _too_large(path, status.st_size, limit)
        data = file.read(limit + 1)
    if len(data) > limit:  # it grew after the check
        raise _too_large(path, len(data), limit)
    return data


def _belongs(target: Path, folder: Path) -> bool:
    """Inside ``folder``, or a blob of the Hugging Face cache repository whose snapshot
    ``folder`` is."""
    if target.is_relative_to(folder):
        return True
    snapshots = folder.parent
    return snapshots.name == "snapshots" and target.parent == snapshots.parent / "blobs"


def _require_regular(path: Path, target: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((kind for test, kind in _KINDS if test(mode)), "a special file")
    via = f" (through a link to {target})" if path.is_symlink() else ""
    raise CheckpointError(
        f"{path}: {kind}{via}, not a regular file; a model's files must be regular files: "
        "replace it with the file itself"
    )


def _too_large(path: Path, size: int, limit: int) -> CheckpointError:
    return CheckpointError(
        f"{path}: {size:,} bytes, over the {limit:,} bytes slotwise reads from a file of this "
        "kind; it is not the file it should be: download it again"
    )


def _missing(path: Path) -> str:
    if path.is_symlink():
        return (
            f"{path}: a link to {os.readlink(path)}, which does not exist; download the model again"
        )
    return f"{path}: missing; download the model again"
