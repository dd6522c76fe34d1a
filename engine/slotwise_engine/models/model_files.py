"""The files of a model folder, read only when they are regular files of that model.

A checkpoint comes from a download, and any of its names can be a symlink, a device
or a FIFO: read blindly, a ``chat_template.jinja`` linked to ``/proc/self/environ``
becomes the prompt, a ``tokenizer.json`` linked to ``/dev/zero`` fills the memory
and one that is a FIFO blocks forever.  A name is accepted when it resolves to a
regular file inside the model folder or, for a snapshot of the Hugging Face cache
(``.../snapshots/<revision>/``), to a blob of the same repository
(``.../blobs/<hash>``): the links the hub client makes.  Each kind of file has a
size limit, checked on the open descriptor, so a file swapped or grown after the
checks is refused all the same.  A file the user cannot read is refused with a message
that says "permission denied", never one that calls the file corrupt.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from slotwise_engine.models.errors import CheckpointError

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


def model_file_exists(folder: Path, name: str) -> bool:
    """Whether the model folder has an entry ``name`` (a dangling link counts: reading
    it names the problem); a folder that cannot be searched is an error, not a "no"."""
    path = Path(folder) / name
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CheckpointError(_unreadable(path, exc, "looked up")) from exc
    return True


def model_file(folder: Path, name: str) -> Path:
    """The real path of ``folder / name``, once it is known to be a regular file of the
    model."""
    path = Path(folder) / name
    try:
        target = Path(os.path.realpath(path, strict=True))
    except FileNotFoundError:
        raise CheckpointError(_missing(path)) from None
    except OSError as exc:  # a symlink loop, a folder that cannot be searched
        raise CheckpointError(_unreadable(path, exc, "resolved")) from exc
    if not _belongs(target, Path(os.path.realpath(folder))):
        raise CheckpointError(
            f"{path}: resolves to {target}, outside the model folder {folder}; slotwise reads "
            "a model's files only from its folder (or from the Hugging Face cache's blobs of "
            "the same model): replace the link with a copy of the file it stands for"
        )
    _require_regular(path, target, os.stat(target).st_mode)
    return target


def open_model_file(folder: Path, name: str) -> int:
    """A read-only descriptor of ``folder / name``, a regular file of the model (checked
    on the descriptor).  Opened non-blocking, so a FIFO swapped in after the checks
    never blocks; the caller closes it."""
    path = Path(folder) / name
    target = model_file(folder, name)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(target, flags)
    except OSError as exc:
        raise CheckpointError(_unreadable(path, exc, "opened")) from exc
    try:
        _require_regular(path, target, os.fstat(descriptor).st_mode)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def read_model_file(folder: Path, name: str, *, limit: int) -> bytes:
    """The bytes of ``folder / name``, a regular file of the model of at most ``limit``
    bytes."""
    path = Path(folder) / name
    with os.fdopen(open_model_file(folder, name), "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            raise _too_large(path, size, limit)
        try:
            data = file.read(limit + 1)
        except OSError as exc:
            raise CheckpointError(_unreadable(path, exc, "read")) from exc
    if len(data) > limit:  # it grew after the check
        raise _too_large(path, len(data), limit)
    return data


def read_model_json(folder: Path, name: str, *, limit: int) -> Any:
    """The JSON value in ``folder / name``.  Whatever the parser refuses (bad syntax, text
    that is not UTF-8, nesting too deep, an integer past Python's digit limit) is one
    CheckpointError naming the file."""
    return parse_model_json(Path(folder) / name, read_model_file(folder, name, limit=limit))


def parse_model_json(path: Path, data: bytes) -> Any:
    """The JSON value of ``data``, the bytes of the model file ``path``; what the parser
    refuses is one CheckpointError naming the file."""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text: {exc}"
    except json.JSONDecodeError as exc:
        reason = str(exc)
    except ValueError as exc:  # json's only other error: an integer past the digit limit
        # Python's text ends with advice for programmers (sys.set_int_max_str_digits).
        reason = f"an integer too long to read: {str(exc).partition(';')[0]}"
    except RecursionError:
        reason = "it is nested too deeply"
    raise CheckpointError(f"{path}: not readable JSON ({reason}); download it again")


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


def _unreadable(path: Path, exc: OSError, action: str) -> str:
    """Why ``path`` could not be looked up, resolved, opened or read, and the fix."""
    if isinstance(exc, PermissionError):
        return (
            f"{path}: permission denied: it cannot be {action} by this user ({exc.strerror}); "
            "make the model folder and its files readable for this user (chmod u+rx on "
            "folders, u+r on files) or run slotwise as a user who can read them"
        )
    return f"{path}: cannot be {action} ({exc.strerror or exc}); download the model again"
