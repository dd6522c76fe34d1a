"""The compile cache: each distinct piece is compiled once per process, and once per machine.

One :class:`CompileCache` serves one compiled Dynamo graph: identical pieces share one
compile, and a second process loads what a persisting compiler saved.  The directory is
named by a hash of everything that changes compiled code; a damaged entry is recompiled,
and an entry another user could have written is never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch.fx as fx

from slotwise.cache_permissions import (
    describe_write_failure,
    make_private_directories,
    read_trusted_file,
    resolve_trusted_directory,
    untrusted_directory,
    write_atomically,
)
from slotwise.compilation.cache.cache_key import directory_factors, folder_key, piece_key
from slotwise.compilation.cache.graph_fingerprint import UnfingerprintableGraph
from slotwise.compilation.cache.inductor_cache_dir import (
    compile_ran_out_of_space,
    move_off_full_disk,
)
from slotwise.compilation.compile_counters import counters
from slotwise.compilation.config import CompilationConfig

if TYPE_CHECKING:
    from slotwise.compilation.compilers import CompiledPiece, Compiler

logger = logging.getLogger(__name__)

FACTORS_FILE = "cache_key_factors.json"
# An entry is this header, the piece's full key, the SHA-256 of the payload and the
# payload: a truncated, garbled or misplaced file is caught before the compiler reads it.
_MAGIC = b"slotwise-compiled-piece-v1\n"
_DIGEST_SIZE = hashlib.sha256().digest_size
_Result = TypeVar("_Result")


class CompileCache:
    """Compiles graph pieces through ``compiler``, reusing earlier results where it can;
    ``factors`` identify the traced code (:func:`cache_key.directory_factors` adds the
    other groups that key the folder)."""

    def __init__(
        self, config: CompilationConfig, compiler: Compiler, *, factors: dict[str, str]
    ) -> None:
        self.factors = directory_factors(config, compiler, factors)
        self.root = config.resolved_cache_dir
        self.directory = os.path.join(self.root, folder_key(self.factors))
        self._compiler = compiler
        self._read_disk = config.cache_enabled and compiler.supports_persistence
        self._write_disk = self._read_disk
        self._directory_ready = False
        self._trust_checked = False
        self._compiled: dict[str, Callable[..., Any]] = {}

    def compile(
        self,
        graph: fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        runtime_shape: int | None,
    ) -> Callable[..., Any]:
        """A callable running ``graph``: from memory, from disk, or freshly compiled."""
        counters.bump("num_backend_compilations")
        try:
            key = piece_key(graph, example_inputs, runtime_shape)
        except UnfingerprintableGraph as err:
            logger.info("compiling a graph piece without the compile cache: %s", err)
            counters.bump("num_cache_misses")
            return self._compile_piece(graph, example_inputs, runtime_shape).fn
        fn = self._compiled.get(key)
        if fn is None and self._read_disk and self._directory_trusted():
            fn = self._load(key, graph, example_inputs, runtime_shape)
        if fn is not None:
            counters.bump("num_cache_hits")
        else:
            counters.bump("num_cache_misses")
            piece = self._compile_piece(graph, example_inputs, runtime_shape)
            fn = piece.fn
            if self._write_disk and piece.save is not None and self._directory_trusted():
                self._save(key, runtime_shape, piece.save)
        self._compiled[key] = fn
        return fn

    def _compile_piece(
        self, graph: fx.GraphModule, example_inputs: Sequence[Any], runtime_shape: int | None
    ) -> CompiledPiece:
        return _off_a_full_disk(
            lambda: self._compiler.compile(graph, example_inputs, runtime_shape=runtime_shape)
        )

    @property
    def persistent(self) -> bool:
        """Whether this cache reads and writes disk (enabled, and the compiler can save)."""
        return self._read_disk

    def read_named(self, name: str) -> bytes | None:
        """The payload of the whole-graph entry ``name`` (the saved Dynamo trace), or None
        when there is none or it may not be used: the folder or the entry is not trusted,
        or the entry cannot be read or is damaged (each said in one warning)."""
        if not (self._read_disk and self._directory_trusted()):
            return None
        path = os.path.join(self.directory, f"{name}.bin")
        if not os.path.isfile(path):
            return None
        try:
            payload = _unwrap_entry(read_trusted_file(path), name)
        except OSError as err:
            logger.warning(
                "compile cache entry %s could not be read (%s); it is rebuilt", path, err
            )
            return None
        if payload is None:
            logger.warning("compile cache entry %s is corrupt or truncated; it is rebuilt", path)
        return payload

    def write_named(self, name: str, payload: bytes) -> None:
        """Write the whole-graph entry ``name``; a failure only costs later processes."""
        if not (self._write_disk and self._directory_trusted()):
            return
        path = os.path.join(self.directory, f"{name}.bin")
        try:
            self._prepare_directory()
            write_atomically(path, _wrap_entry(payload, name))
        except OSError as err:
            logger.warning(
                "compile cache entry %s could not be written: %s",
                path,
                describe_write_failure(self.directory, err),
            )
            return
        logger.debug("compile cache: saved %s", path)

    def _entry_path(self, key: str, runtime_shape: int | None) -> str:
        shape = "general" if runtime_shape is None else f"size{runtime_shape}"
        return os.path.join(self.directory, f"{shape}-{key[:32]}.bin")

    def _load(
        self,
        key: str,
        graph: fx.GraphModule,
        example_inputs: Sequence[Any],
        runtime_shape: int | None,
    ) -> Callable[..., Any] | None:
        path = self._entry_path(key, runtime_shape)
        if not os.path.isfile(path):
            return None
        try:
            payload = _unwrap_entry(read_trusted_file(path), key)
            if payload is None:
                logger.warning(
                    "compile cache entry %s is corrupt or truncated; recompiling and "
                    "overwriting it",
                    path,
                )
                return None
            with tempfile.TemporaryDirectory(prefix="slotwise-load-") as staging:
                staged = os.path.join(staging, "piece.bin")
                with open(staged, "wb") as file:
                    file.write(payload)
                fn = _off_a_full_disk(
                    lambda: self._compiler.load(
                        staged, graph, example_inputs, runtime_shape=runtime_shape
                    )
                )
        except Exception as err:  # noqa: BLE001 - whatever failed, recompiling is correct
            logger.warning(
                "compile cache entry %s could not be loaded (%s: %s); recompiling and "
                "overwriting it",
                path,
                type(err).__name__,
                err,
            )
            return None
        logger.debug("compile cache: loaded %s", path)
        return fn

    def _save(self, key: str, runtime_shape: int | None, save: Callable[[str], None]) -> None:
        path = self._entry_path(key, runtime_shape)
        try:
            with tempfile.TemporaryDirectory(prefix="slotwise-save-") as staging:
                staged = os.path.join(staging, "piece.bin")
                save(staged)
                with open(staged, "rb") as file:
                    payload = file.read()
        except Exception as err:  # noqa: BLE001 - an unsaved piece still runs
            logger.warning(
                "compiled piece for %s could not be saved (%s: %s); it is kept in memory only",
                path,
                type(err).__name__,
                err,
            )
            return
        try:
            self._prepare_directory()
            write_atomically(path, _wrap_entry(payload, key))
        except OSError as err:
            self._write_disk = False
            logger.warning(
                "compile cache not written: %s; running uncached: new compiles are kept in "
                "memory only. Fix it, or set SLOTWISE_CACHE_ROOT (or the config's cache_dir) "
                "to a folder of yours that you can write, on a disk with room",
                describe_write_failure(self.directory, err),
            )
            return
        logger.debug("compile cache: saved %s", path)

    def _directory_trusted(self) -> bool:
        """False, with one warning, when another user could have written this cache: its
        entries are code, so it is neither read nor written. When trusted, the cache's
        folder is its real path from then on: no link on the way is followed again."""
        if self._trust_checked:
            return self._read_disk or self._write_disk
        self._trust_checked = True
        real, reason = resolve_trusted_directory(self.directory, self.root)
        if reason is None:
            self.directory, self.root = real, os.path.dirname(real)
            return True
        self._read_disk = self._write_disk = False
        logger.warning(
            "compile cache not trusted: %s; compiling without the cache. Use a cache folder "
            "of your own (SLOTWISE_CACHE_ROOT or the config's cache_dir) or make it private: "
            "chmod 700",
            reason,
        )
        return False

    def _prepare_directory(self) -> None:
        if self._directory_ready:
            return
        make_private_directories(self.directory)
        reason = untrusted_directory(self.directory, self.root)
        if reason is not None:
            raise PermissionError(f"not trusted: {reason}")
        factors = json.dumps(self.factors, indent=2, sort_keys=True) + "\n"
        write_atomically(os.path.join(self.directory, FACTORS_FILE), factors.encode("utf-8"))
        self._directory_ready = True


def _off_a_full_disk(action: Callable[[], _Result]) -> _Result:
    """``action()`` (a compile, or a load, which writes the piece's code out too); one that
    ran out of disk space is tried once more, after Inductor's caches moved to a private
    folder with room (one warning; :class:`CacheDiskFullError` where it has none)."""
    try:
        return action()
    except Exception as err:
        if not compile_ran_out_of_space(err):
            raise
        move_off_full_disk()
    return action()


def _wrap_entry(payload: bytes, key: str) -> bytes:
    return _MAGIC + key.encode("ascii") + b"\n" + hashlib.sha256(payload).digest() + payload


def _unwrap_entry(blob: bytes, key: str) -> bytes | None:
    """The payload of an entry that :func:`_wrap_entry` wrote for ``key``, or None."""
    header = _MAGIC + key.encode("ascii") + b"\n"
    if not blob.startswith(header):
        return None
    digest = blob[len(header) : len(header) + _DIGEST_SIZE]
    payload = blob[len(header) + _DIGEST_SIZE :]
    return payload if hashlib.sha256(payload).digest() == digest else None
