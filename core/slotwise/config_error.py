"""``ConfigError``, the error of a rejected setting, and the way its messages show values.

Below the compilation package, so modules of lower layers that validate a setting (the
graph mode a forward context carries) raise the same error the compilation config does.
"""

from __future__ import annotations

from slotwise.errors import SlotwiseError


class ConfigError(SlotwiseError, ValueError):
    """A compilation setting was rejected; the message says which and what would be accepted."""


def shown(value: object) -> str:
    """``repr`` cut to a readable length; some values (a 5000-digit int) have none at all."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= 200 else f"{text[:200]}..."


def rejected(key: str, value: object, accepted: str) -> ConfigError:
    """The error for ``key`` set to ``value``, naming what is ``accepted``."""
    return ConfigError(f"compilation config key {key!r}: got {shown(value)}; accepted: {accepted}")
