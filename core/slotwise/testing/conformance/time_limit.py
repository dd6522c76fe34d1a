"""The time limit of each test of the suite: a check that hangs fails, and the run ends.

A hang may be in Python or in native code, so the limit acts in three stages:
1. SIGALRM interrupts the test in the main thread, which fails, and the suite goes on;
2. a native call never returns to Python, so ``GRACE_S`` later a watchdog thread writes
   the message and every traceback, records the failure and ends the process (exit 1);
3. a native call holding the GIL stops that thread too, so ``faulthandler``'s native
   thread ends the process another ``GRACE_S`` later.
(pytest-timeout is no dependency, and has stage 1 or 2 only.)
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

import pytest

#: Seconds between the stages.
GRACE_S = 5.0
#: What a hung test leaves behind in stage 2's message.
NATIVE_HANG = (
    "; it did not return to Python {grace:g} s later either, so it is stuck in native code "
    "(a kernel or a driver call that never finishes): the watchdog ended the test process; "
    "the tracebacks of its threads are in pytest's output"
)


class TimeLimit:
    """Arms the three stages around each test (``start``/``stop``); a limit of 0 arms none.
    Stages 2 and 3 write to ``stderr_fd``, which pytest's capture does not redirect."""

    def __init__(self, limit_s: float, stderr_fd: int, on_hang: Callable[[str], None]) -> None:
        self.limit_s = limit_s
        self.stderr_fd = stderr_fd
        self.on_hang = on_hang
        self._describe: Callable[[], str] = lambda: "a test exceeded the time limit"
        self._changed = threading.Condition()
        self._deadline: float | None = None  # stage 2, on the monotonic clock
        self._watchdog: threading.Thread | None = None
        self._alarm = hasattr(signal, "setitimer")
        self._previous_handler: object = None

    def start(self, describe: Callable[[], str]) -> None:
        if self.limit_s <= 0:
            return
        self._describe = describe
        if self._alarm and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGALRM, self._interrupt)
            signal.setitimer(signal.ITIMER_REAL, self.limit_s)
        with self._changed:
            self._deadline = time.monotonic() + self.limit_s + GRACE_S
            self._changed.notify()
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name="slotwise-conformance-time-limit", daemon=True
            )
            self._watchdog.start()
        faulthandler.dump_traceback_later(
            self.limit_s + 2 * GRACE_S, exit=True, file=self.stderr_fd
        )

    def stop(self) -> None:
        """Disarm every stage (the test ended, or it is handed to a debugger)."""
        if self.limit_s <= 0:
            return
        faulthandler.cancel_dump_traceback_later()
        with self._changed:
            self._deadline = None
            self._changed.notify()
        if self._previous_handler is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous_handler)  # type: ignore[arg-type]
            self._previous_handler = None

    def _interrupt(self, signum: int, frame: FrameType | None) -> NoReturn:
        """Stage 1: fail the test where it is (its traceback shows where it hung)."""
        raise pytest.fail.Exception(self._describe(), pytrace=True)

    def _watch(self) -> None:
        """Stage 2: wait for a deadline that passes, then end the process."""
        with self._changed:
            while self._deadline is None or time.monotonic() < self._deadline:
                if self._deadline is None:
                    self._changed.wait()
                else:
                    self._changed.wait(max(0.0, self._deadline - time.monotonic()))
        message = self._describe() + NATIVE_HANG.format(grace=GRACE_S)
        try:
            os.write(self.stderr_fd, f"\n{message}\n".encode(errors="replace"))
            faulthandler.dump_traceback(file=self.stderr_fd, all_threads=True)
            self.on_hang(message)
        finally:
            os._exit(1)
