"""The compilation config that decorated models pick up when none is passed."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from slotwise.compilation.config import CompilationConfig

_current: contextvars.ContextVar[CompilationConfig | None] = contextvars.ContextVar(
    "slotwise_compilation_config", default=None
)


@contextlib.contextmanager
def set_compilation_config(config: Any) -> Iterator[CompilationConfig]:
    """Models constructed inside the block use ``config`` (anything ``coerce`` accepts)."""
    resolved = CompilationConfig.coerce(config)
    token = _current.set(resolved)
    try:
        yield resolved
    finally:
        _current.reset(token)


def get_current_compilation_config() -> CompilationConfig:
    """The config of the innermost ``set_compilation_config``, else the environment's."""
    config = _current.get()
    return config if config is not None else CompilationConfig.from_env()
