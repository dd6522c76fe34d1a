"""Platforms: the ``Platform`` interface, plugin-provided specs and resolution."""

from __future__ import annotations

from typing import Any

from slotwise.platforms.errors import PlatformError, PlatformNotFoundError
from slotwise.platforms.interface import Platform
from slotwise.platforms.resolution import (
    ReportRow,
    get_current_platform,
    plugin_report,
    use_platform,
)
from slotwise.platforms.spec import PlatformSpec
from slotwise.platforms.unspecified import UnspecifiedPlatform


class _CurrentPlatform:
    """Resolves the platform on first attribute access, so that importing
    ``current_platform`` costs nothing and probes run only when needed."""

    __slots__ = ()

    def __getattr__(self, attr: str) -> Any:
        return getattr(get_current_platform(), attr)

    def __repr__(self) -> str:
        return repr(get_current_platform())

    def __dir__(self) -> list[str]:
        return dir(get_current_platform())


#: The platform of this process (a lazy proxy; ``get_current_platform()`` gives the object).
current_platform: Platform = _CurrentPlatform()  # type: ignore[assignment]

__all__ = [
    "Platform",
    "PlatformError",
    "PlatformNotFoundError",
    "PlatformSpec",
    "ReportRow",
    "UnspecifiedPlatform",
    "current_platform",
    "get_current_platform",
    "plugin_report",
    "use_platform",
]
