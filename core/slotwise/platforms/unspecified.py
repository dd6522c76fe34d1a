"""``UnspecifiedPlatform``: what ``current_platform`` is when nothing can run."""

from __future__ import annotations

from typing import Any

from slotwise.platforms.errors import PlatformNotFoundError
from slotwise.platforms.interface import Platform

_INTROSPECTION = frozenset({"reason", "is_unspecified"})


class UnspecifiedPlatform(Platform):
    """Stands in when no platform is available; any real use raises.

    Resolution itself must not fail just because nothing is installed (``slotwise
    env`` still has to report that), so the error is deferred to the first use.
    """

    name = "unspecified"
    device_type = "unspecified"
    is_unspecified = True

    def __init__(self, reason: str) -> None:
        object.__setattr__(self, "reason", reason)

    def __getattribute__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in _INTROSPECTION:
            return object.__getattribute__(self, attr)
        raise PlatformNotFoundError(object.__getattribute__(self, "reason"))

    def __repr__(self) -> str:
        return "<UnspecifiedPlatform: no platform available>"
