"""Finding the plugins' entry points without importlib.metadata while nothing was installed.

Why: importlib.metadata imports email, zipfile, csv and more, then parses the
entry_points.txt of every installed distribution: about a third of what ``import
slotwise`` plus platform resolution costs.  Its answer changes only when the
installation does, so it is kept, per user, with the state of the installation it was
read from, and used only while every part of that state is unchanged:

* each ``sys.path`` entry's status (mtime, size, inode, device): installing, removing or
  renaming a distribution adds, removes or renames its ``*.dist-info``/``*.egg-info``
  folder, which changes the mtime of the folder holding it; a zip file's status changes
  with its content;
* each such distribution folder's status (a file added to or removed from it) and those
  of its ``entry_points.txt`` and metadata file (edited in place).

``.pth`` files need no watching: what they did at start-up is in ``sys.path`` (part of
the key) or is an import finder (an editable install's), which finds modules, not
distributions.  A ``sys.meta_path`` finder other than ``PathFinder`` that finds
distributions turns the cache off: its answers cannot be keyed.

A state with an mtime less than ``RACY_SECONDS`` old is not saved: a second change
within the file system's timestamp granularity would keep that mtime, and the cache
would miss it (git's "racily clean" entries).  The cache (``~/.cache/slotwise/discovery``)
names modules that slotwise imports, so a folder or file another user could have written
is never read, as for the compile cache.  Anything else off (no cache yet, a damaged
file, a read-only home) falls back to importlib.metadata with a log line saying why.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import logging
import marshal
import os
import sys
import time
import zlib
from typing import Any, Protocol

from slotwise import envs
from slotwise.cache_permissions import (
    make_private_directories,
    read_trusted_file,
    untrusted_directory,
    write_atomically,
)

logger = logging.getLogger("slotwise")

DISABLE_VARIABLE = "SLOTWISE_DISABLE_DISCOVERY_CACHE"
DEFAULT_FOLDER = "~/.cache/slotwise/discovery"
#: Changes younger than this may share an mtime with a later change: not saved.
RACY_SECONDS = 2
#: One file per distinct sys.path; the least recently written beyond this are removed.
MAX_CACHE_FILES = 64
_FORMAT = 1
_SUFFIX = ".bin"

#: ``(mtime_ns, size, inode, device)`` of a path, or None when nothing is there.
Status = tuple[int, int, int, int] | None


class DistributionNames(Protocol):
    """What plugin reports read from a distribution: importlib.metadata's or the cache's."""

    @property
    def name(self) -> str | None: ...

    @property
    def version(self) -> str | None: ...


# Plain classes, not dataclasses: creating a dataclass costs about half a millisecond,
# and this module is imported by every ``import slotwise`` that resolves the platform.


class CachedDistribution:
    """A distribution's name and version, read from its metadata when the cache was built."""

    __slots__ = ("name", "version")

    def __init__(self, name: str | None, version: str | None) -> None:
        self.name = name
        self.version = version


class FoundEntryPoint:
    """One entry point of the group, in the order importlib.metadata lists them."""

    __slots__ = ("dist", "name", "value")

    def __init__(self, name: str, value: str, dist: DistributionNames | None) -> None:
        self.name = name
        self.value = value
        self.dist = dist


class _Unusable(Exception):
    """The cache cannot answer for this process; the message says why."""


def find_entry_points(group: str, folder: str | None = None) -> list[FoundEntryPoint]:
    """The entry points of ``group``, as ``importlib.metadata.entry_points(group=group)``
    lists them, from the cache in ``folder`` (default ``~/.cache/slotwise/discovery``)
    when the installation is unchanged since it was written."""
    if envs.flag(DISABLE_VARIABLE):
        logger.debug("plugin discovery: %s is set, reading importlib.metadata", DISABLE_VARIABLE)
        return _from_importlib_metadata(group)
    try:
        cache = _CacheFile.for_this_process(group, folder or os.path.expanduser(DEFAULT_FOLDER))
    except _Unusable as why:
        logger.debug("plugin discovery cache not used: %s; reading importlib.metadata", why)
        return _from_importlib_metadata(group)
    found = cache.load()
    return found if found is not None else cache.rebuild()


def _from_importlib_metadata(group: str) -> list[FoundEntryPoint]:
    import importlib.metadata  # the import the cache saves, deferred to here

    return [
        FoundEntryPoint(ep.name, ep.value, ep.dist)
        for ep in importlib.metadata.entry_points(group=group)
    ]


class _CacheFile:
    """The cache file of this process's ``sys.path`` and entry-point group."""

    def __init__(self, group: str, folder: str, entries: tuple[str, ...]) -> None:
        self.group = group
        self.folder = folder
        #: ``sys.path``, absolute (``""`` is the working directory).
        self.entries = entries
        #: What the file must have been written for: format, Python, group, sys.path.
        self.identity = (_FORMAT, sys.implementation.cache_tag, sys.hexversion, group, entries)
        # A collision of two identities' names costs a rewrite, never a wrong answer.
        name = zlib.crc32(repr(self.identity).encode("utf-8", "surrogateescape"))
        self.path = os.path.join(folder, f"{name:08x}{_SUFFIX}")

    @classmethod
    def for_this_process(cls, group: str, folder: str) -> _CacheFile:
        """The cache file for this process; ``_Unusable`` says why there can be none."""
        if not os.path.isabs(folder):
            raise _Unusable(f"no home folder to keep it in ({folder!r} is not absolute)")
        others = [
            repr(finder)
            for finder in sys.meta_path
            if finder is not importlib.machinery.PathFinder
            and hasattr(finder, "find_distributions")
        ]
        if others:
            raise _Unusable(f"sys.meta_path has distribution finders {', '.join(others)}")
        if not all(isinstance(entry, str) for entry in sys.path):
            raise _Unusable("sys.path holds entries that are not strings")
        reason = untrusted_directory(folder, os.path.dirname(folder))
        if reason is not None:
            logger.warning(
                "plugin discovery cache not trusted: %s; finding plugins without it. Make "
                "it private (chmod 700 %s) or remove it",
                reason,
                folder,
            )
            raise _Unusable(reason)
        return cls(group, folder, tuple(os.path.abspath(entry) for entry in sys.path))

    def load(self) -> list[FoundEntryPoint] | None:
        """The cached entry points, or None (logged) when they may be out of date."""
        try:
            blob = read_trusted_file(self.path)
        except FileNotFoundError:
            logger.debug("plugin discovery cache %s not written yet", self.path)
            return None
        except OSError as err:  # PermissionError says why it is not trusted
            logger.warning("plugin discovery cache %s ignored and rebuilt: %s", self.path, err)
            return None
        saved = _decode(blob)
        if saved is None:
            logger.warning("plugin discovery cache %s is damaged; ignored and rebuilt", self.path)
            return None
        identity, statuses, entry_points = saved
        if identity != self.identity:
            logger.debug("plugin discovery cache %s was written for another sys.path", self.path)
            return None
        for watched, status in statuses:
            try:
                now = _status(watched)
            except OSError as err:
                now = f"unreadable ({err})"
            if now != status:
                logger.debug(
                    "plugin discovery cache %s is out of date: %s changed", self.path, watched
                )
                return None
        logger.debug(
            "plugin discovery: %d entry points from cache %s", len(entry_points), self.path
        )
        return [
            FoundEntryPoint(name, value, None if dist is None else CachedDistribution(*dist))
            for name, value, dist in entry_points
        ]

    def rebuild(self) -> list[FoundEntryPoint]:
        """importlib.metadata's answer, saved with the state it was read from when safe."""
        started = time.time_ns()
        try:
            statuses = _installation_state(self.entries)
        except OSError as err:
            logger.debug("plugin discovery cache not saved: installation unreadable (%s)", err)
            return _from_importlib_metadata(self.group)
        found = _from_importlib_metadata(self.group)  # read after the state: never newer
        recent = started - RACY_SECONDS * 1_000_000_000
        racy = [path for path, status in statuses if status and status[0] > recent]
        if racy:
            logger.debug(
                "plugin discovery cache not saved: %s changed less than %g s ago, too recently "
                "to tell a later change by its mtime",
                racy[0],
                RACY_SECONDS,
            )
            return found
        # Names and versions read now, while saving, so that later processes need not.
        found = [FoundEntryPoint(ep.name, ep.value, _names_of(ep.dist)) for ep in found]
        try:
            self._save(statuses, found)
        except OSError as err:
            logger.debug("plugin discovery cache %s not saved: %s", self.path, err)
        return found

    def _save(self, statuses: list[tuple[str, Status]], found: list[FoundEntryPoint]) -> None:
        entry_points = [
            (ep.name, ep.value, None if ep.dist is None else (ep.dist.name, ep.dist.version))
            for ep in found
        ]
        payload = marshal.dumps((self.identity, statuses, entry_points))
        make_private_directories(self.folder)
        # Again: a folder missing at the first check may have been made by someone else.
        reason = untrusted_directory(self.folder, os.path.dirname(self.folder))
        if reason is not None:
            raise PermissionError(f"not trusted: {reason}")
        write_atomically(self.path, _header() + _checksum(payload) + payload)
        _remove_oldest(self.folder)
        logger.debug("plugin discovery cache: saved %s", self.path)


def _names_of(dist: DistributionNames | None) -> CachedDistribution | None:
    return None if dist is None else CachedDistribution(dist.name, dist.version)


def _header() -> bytes:
    """Format and Python of a cache file: marshal's format differs between versions."""
    return f"slotwise discovery cache {_FORMAT} {sys.implementation.cache_tag}\n".encode()


def _checksum(payload: bytes) -> bytes:
    """A damaged file is told by this, before marshal (not made for bad input) reads it."""
    return zlib.crc32(payload).to_bytes(4, "big")


def _decode(blob: bytes) -> tuple[Any, list[tuple[str, Status]], list[Any]] | None:
    """What ``_save`` wrote, or None for anything else (checked before unmarshalling)."""
    header = _header()
    checksum, body = blob[len(header) : len(header) + 4], blob[len(header) + 4 :]
    if not blob.startswith(header) or checksum != _checksum(body):
        return None
    try:
        identity, statuses, entry_points = marshal.loads(body)
        return identity, [(path, status) for path, status in statuses], list(entry_points)
    except (ValueError, TypeError, EOFError):
        return None


def _status(path: str) -> Status:
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (found.st_mtime_ns, found.st_size, found.st_ino, found.st_dev)


def _installation_state(entries: tuple[str, ...]) -> list[tuple[str, Status]]:
    """The status of every path whose change could change what importlib.metadata finds.

    Distributions are what importlib.metadata's path finder lists in a ``sys.path``
    folder: its ``*.dist-info`` and ``*.egg-info`` entries (any case), and an ``.egg``
    folder's ``EGG-INFO``.
    """
    statuses = [(entry, _status(entry)) for entry in entries]
    for entry in entries:
        if not os.path.isdir(entry):
            continue  # missing, or a zip file: its own status covers its content
        egg = entry.lower().endswith(".egg")
        with os.scandir(entry) as children:
            for child in children:
                low = child.name.lower()
                if not (low.endswith((".dist-info", ".egg-info")) or (egg and low == "egg-info")):
                    continue
                statuses.append((child.path, _status(child.path)))
                if child.is_dir():
                    metadata = "METADATA" if low.endswith(".dist-info") else "PKG-INFO"
                    for name in ("entry_points.txt", metadata):
                        path = os.path.join(child.path, name)
                        statuses.append((path, _status(path)))
    return statuses


def _remove_oldest(folder: str) -> None:
    """Keep at most ``MAX_CACHE_FILES``: every distinct sys.path (venv, script folder,
    working directory of ``python -c``) writes its own file."""
    with os.scandir(folder) as entries:
        files = [entry for entry in entries if entry.name.endswith(_SUFFIX)]
    if len(files) <= MAX_CACHE_FILES:
        return
    files.sort(key=lambda entry: entry.stat().st_mtime_ns)
    for entry in files[: len(files) - MAX_CACHE_FILES]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
