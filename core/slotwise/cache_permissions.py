"""Whose cache is it: the checks that keep another local user's code out of slotwise's caches.

A cache entry is code, and a checksum does not say who wrote it: a folder or entry is
trusted only when you (or root) own it and nobody else may write it, checked from ``/``
down as ssh's ``StrictModes`` does; what is handed on is the real path checked, never a
link.  Folders made here are private (0700) and entries written whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
#: Links followed on one path before it is refused (the kernel's own limit).
_MAX_LINKS = 40


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
    """Why ``path`` (a folder of the cache ``root``) or anything on the way to it is not
    trusted, or None when it is; above ``root`` a sticky folder such as ``/tmp`` passes."""
    return resolve_trusted_directory(path, root)[1]


def resolve_trusted_directory(path: str, root: str) -> tuple[str, str | None]:
    """``path`` with every link resolved, and why it is not trusted (None when it is):
    checked while resolving, so the real path returned is the one checked."""
    path, root = os.path.abspath(path), os.path.abspath(root)
    if not hasattr(os, "getuid"):
        return os.path.realpath(path), None  # no POSIX owners: nothing to walk
    depth = len(_components(root)) if _is_within(path, root) else 0
    # Pending components, each with whether it is inside the cache (at or below root).
    pending = [(name, index + 1 >= depth) for index, name in enumerate(_components(path))]
    pending.reverse()
    resolved, links = os.sep, 0
    while pending:
        name, inside = pending.pop()
        if name == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, name)
        try:
            status = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            # Not there (yet): nothing planted in it, and slotwise creates the rest private.
            rest = [name for name, _ in reversed(pending)]
            return os.path.join(candidate, *rest), None
        except OSError as err:
            return candidate, f"{candidate} cannot be checked ({_problem(err)})"
        if stat.S_ISLNK(status.st_mode):
            if status.st_uid not in (os.getuid(), 0):
                return candidate, (
                    f"{candidate} is a symbolic link owned by uid {status.st_uid}, not by "
                    f"you (uid {os.getuid()}): its owner can re-point it at any time"
                )
            links += 1
            if links > _MAX_LINKS:
                return candidate, f"{candidate} goes through more than {_MAX_LINKS} links"
            target = os.readlink(candidate)
            parts = _components(target)
            # The target's last component stands for the link; those before it lead there.
            expansion = [(part, False) for part in parts]
            if expansion:
                expansion[-1] = (parts[-1], inside)
            pending.extend(reversed(expansion))
            if os.path.isabs(target):
                resolved = os.sep
            continue
        reason = _untrusted_component(candidate, status, inside)
        if reason is not None:
            return candidate, reason
        resolved = candidate
    return resolved, None


def describe_write_failure(folder: str, err: OSError) -> str:
    """What stopped a write into ``folder``, in the user's terms (full disk, quota,
    permission, read-only), for a message that goes on to say the fix."""
    if err.errno == errno.ENOSPC:
        return f"the disk holding {folder} is full ({_room_left(folder)})"
    if err.errno == errno.EDQUOT:
        return f"your disk quota is used up where {folder} is ({_room_left(folder)})"
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied writing into {folder}: make it yours and writable (chmod u+w)"
    if err.errno == errno.EROFS:
        return f"{folder} is on a read-only file system"
    return f"{folder} cannot be written ({_problem(err)})"


def out_of_space(err: OSError) -> bool:
    """Whether ``err`` says the disk or the user's quota is full."""
    return err.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_room(folder: str) -> tuple[int, int | None] | None:
    """The free MiB and free inodes (None: the file system has no inode limit) on the disk
    holding ``folder``, or the nearest folder above it that exists; None when unknown."""
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        disk = os.statvfs(folder)
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return None
    return disk.f_bavail * disk.f_frsize // 2**20, disk.f_favail if disk.f_files else None


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
    """The bytes of ``path``, refusing a link or an entry someone else could have written
    (checked on the open descriptor, so it cannot be swapped between check and read)."""
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


def _untrusted_component(path: str, status: os.stat_result, inside: bool) -> str | None:
    """:func:`untrusted_reason`, except that above the cache a sticky folder others may
    write is fine (its entries are checked in turn)."""
    sticky_folder = stat.S_ISDIR(status.st_mode) and status.st_mode & stat.S_ISVTX
    if not inside and sticky_folder and status.st_uid in (os.getuid(), 0):
        return None
    return untrusted_reason(path, status)


def _components(path: str) -> list[str]:
    return [part for part in path.split(os.sep) if part not in ("", ".")]


def _is_within(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _problem(err: OSError) -> str:
    return err.strerror.lower() if err.strerror else str(err)


def _room_left(folder: str) -> str:
    room = disk_room(folder)
    if room is None:
        return "its free space cannot be read"
    free_mib, free_inodes = room
    free = f"{free_mib} MiB free" if free_mib else "less than 1 MiB free"
    return f"{free} but no inodes left" if free_inodes == 0 else free
