"""Whose cache is it: the checks that keep another local user's code out of slotwise's caches.

A cache entry is code (a pickled compiled artifact, a list of plugin entry points). Its
checksum proves the file is whole, not who wrote it, so slotwise trusts a cache folder or
entry only when the current user (or root) owns it and neither group nor others may write
to it, as ssh and pip do; folders it creates itself are private (0700), and entries are
written whole (``write_atomically``).
"""

from __future__ import annotations

import contextlib
import os
import stat

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def untrusted_reason(path: str, status: os.stat_result) -> str | None:
    """Why ``path`` (with ``status``) is not to be trusted, or None when it is."""
    if not hasattr(os, "getuid"):
        return None  # no POSIX owners (Windows): the user profile's ACLs protect it
    user = os.getuid()
    if status.st_uid not in (user, 0):
        return f"{path} is owned by uid {status.st_uid}, not by you (uid {user})"
    if status.st_mode & _WRITABLE_BY_OTHERS:
        mode = stat.S_IMODE(status.st_mode)
        return f"{path} is writable by group or others (mode {mode:o})"
    return None


def untrusted_directory(path: str, root: str) -> str | None:
    """Why ``path`` or a folder between it and the cache ``root`` is not trusted.

    Folders that do not exist yet are fine: slotwise creates them private.
    """
    path, root = os.path.abspath(path), os.path.abspath(root)
    folders = [path]
    while folders[-1] != root and os.path.dirname(folders[-1]) != folders[-1]:
        folders.append(os.path.dirname(folders[-1]))
    for folder in reversed(folders):
        try:
            status = os.stat(folder)
        except (FileNotFoundError, NotADirectoryError):
            return None  # not there (yet): nothing planted in it
        except OSError as err:
            return f"{folder} cannot be checked ({err})"
        reason = untrusted_reason(folder, status)
        if reason is not None:
            return reason
    return None


def make_private_directories(path: str) -> None:
    """Create ``path`` and every missing parent readable by the current user only."""
    missing = []
    folder = os.path.abspath(path)
    while not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # created meanwhile by another process; trust is checked by the caller


def read_trusted_file(path: str) -> bytes:
    """The bytes of ``path``, refusing a link or an entry someone else could have written.

    Checked on the open descriptor, so the file cannot be swapped between check and read.
    """
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(descriptor, "rb") as file:
        reason = untrusted_reason(path, os.fstat(file.fileno()))
        if reason is not None:
            raise PermissionError(f"not trusted: {reason}")
        return file.read()


def write_atomically(path: str, data: bytes) -> None:
    """Write through a private temporary file and a rename: readers never see half a file,
    and a crash leaves the old file or none."""
    import tempfile  # only when (re)writing, never on a cache's fast path

    folder, name = os.path.split(path)
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
