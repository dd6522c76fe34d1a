"""Fixtures of the model tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture
def never_hang() -> Iterator[None]:
    """A read or a rendering that blocks (a FIFO opened for reading, a template the
    bounds miss) fails its test after two minutes instead of hanging the run."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the test blocked: a read or a rendering did not end")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
