"""Running plugin code (an entry point's import, a hook, a probe) so that it cannot take
slotwise down: in a daemon thread within a time limit, ``sys.exit()`` a broken plugin,
stdout on stderr, SLOTWISE_* variables put back, non-daemon threads remembered.

``os._exit()`` or a native crash no in-process guard can stop (docs/plugin-authors.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TextIO, TypeVar

from slotwise import envs
from slotwise.errors import SlotwiseError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Labelled(Protocol):
    """Whose code runs: a plugin record (``PluginRecord``) or anything with its label."""

    @property
    def label(self) -> str: ...


class PluginCodeError(SlotwiseError, RuntimeError):
    """Plugin code failed in a way no exception of its own describes; ``phrase`` completes
    a sentence about the action: "timed out after 10 s; ..."."""

    def __init__(self, label: str, action: str, phrase: str) -> None:
        super().__init__(f"{label}: {action} {phrase}")
        self.label, self.action, self.phrase = label, action, phrase

    def __reduce__(self) -> tuple[Any, ...]:  # pickled with the three arguments, not one
        return type(self), (self.label, self.action, self.phrase)


class PluginTimeout(PluginCodeError):
    """Plugin code did not return within its time limit (not a TimeoutError: one that the
    plugin's own code raises is an ordinary error of the plugin)."""


class PluginExit(PluginCodeError):
    """Plugin code raised SystemExit (``sys.exit()``), which would end every command."""


def describe(exc: BaseException) -> str:
    """``"ValueError: bad"`` (``"ValueError"`` when the message is empty)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def outcome(exc: Exception) -> str:
    """How plugin code failed, completing "<action> ...": "raised ValueError: bad",
    "timed out after 10 s; ...", "called sys.exit(1), ..."."""
    if isinstance(exc, PluginCodeError):
        return exc.phrase
    return f"raised {describe(exc)}"


def call_plugin_code(
    record: Labelled, action: str, func: Callable[[], T], *, limit_s: float, variable: str
) -> T:
    """``func()`` under ``plugin_code``, in a daemon thread, waited for at most ``limit_s``
    (else ``PluginTimeout`` naming ``variable``, which sets the limit)."""
    with plugin_code(record, action):
        outcome_box: list[tuple[bool, Any]] = []

        def target() -> None:
            try:
                outcome_box.append((True, func()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                outcome_box.append((False, exc))

        thread = threading.Thread(target=target, name=f"slotwise: {action}", daemon=True)
        thread.start()
        thread.join(limit_s)
        if not outcome_box:
            raise PluginTimeout(
                record.label,
                action,
                f"timed out after {limit_s:g} s and was left running in the background; "
                f"if it is only slow, raise {variable} (now {limit_s:g} s)",
            )
        returned, value = outcome_box[0]
        if not returned:
            raise value
        return value


@contextlib.contextmanager
def plugin_code(record: Labelled, action: str) -> Iterator[None]:
    """Run plugin code (``action``, e.g. "hook slotwise_platforms") under guard, in this
    thread; the debug log names it first, in case it ends the process."""
    if logger.isEnabledFor(logging.DEBUG):  # a label reads the distribution's metadata
        logger.debug("%s: %s", record.label, action)
    before = envs.settings()
    threads_before = set(threading.enumerate())
    try:
        with stdout_to_stderr():
            yield
    except SystemExit as exc:
        raise PluginExit(
            record.label,
            action,
            f"called sys.exit({_exit_code(exc)}), which would end the process; plugin code "
            "must raise an exception instead",
        ) from exc
    except Exception:
        raise
    except BaseException as exc:
        logger.error("%s interrupted by %s during %s", record.label, describe(exc), action)
        raise
    finally:
        _remember_new_threads(record, action, threads_before)
        _restore_settings(record, action, before)


def _exit_code(exc: SystemExit) -> str:
    return "" if exc.code is None else repr(exc.code)


def _restore_settings(record: Labelled, action: str, before: dict[str, str]) -> None:
    after = envs.settings()
    for name in sorted(before.keys() | after.keys()):
        if before.get(name) == after.get(name):
            continue
        logger.warning(
            "%s changed %s from %s to %s during %s; slotwise put back the user's value. "
            "Plugins must not change SLOTWISE_* variables: fix or uninstall the plugin.",
            record.label,
            name,
            _shown(before.get(name)),
            _shown(after.get(name)),
            action,
        )
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)


#: Non-daemon threads started by plugin code: (thread, plugin label, action).
_plugin_threads: list[tuple[threading.Thread, str, str]] = []


def _remember_new_threads(record: Labelled, action: str, before: set[threading.Thread]) -> None:
    for thread in threading.enumerate():
        if thread not in before and not thread.daemon and thread.is_alive():
            _plugin_threads.append((thread, record.label, action))


def lingering_plugin_threads(wait_s: float) -> list[str]:
    """The non-daemon threads plugin code started that are still running after waiting
    up to ``wait_s`` seconds for them, each described with its plugin and action."""
    deadline = time.monotonic() + wait_s
    lingering = []
    for thread, label, action in _plugin_threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            lingering.append(f"thread {thread.name!r} started by {label} during {action}")
    return lingering


_stdout_lock = threading.Lock()
_stdout_users = 0
_stdout_saved: TextIO | None = None


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """``sys.stdout`` is ``sys.stderr`` for as long as any thread is inside (unlike
    ``contextlib.redirect_stdout``, safe with threads)."""
    global _stdout_users, _stdout_saved
    with _stdout_lock:
        if _stdout_users == 0:
            _stdout_saved, sys.stdout = sys.stdout, sys.stderr
        _stdout_users += 1
    try:
        yield
    finally:
        with _stdout_lock:
            _stdout_users -= 1
            if _stdout_users == 0:
                sys.stdout, _stdout_saved = _stdout_saved, None
