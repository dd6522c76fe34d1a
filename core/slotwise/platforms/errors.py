"""Errors of platform resolution."""

from __future__ import annotations

from slotwise.errors import SlotwiseError


class PlatformError(SlotwiseError, RuntimeError):
    """The platform cannot be chosen: a tie, an incompatible or broken plugin."""


class PlatformNotFoundError(PlatformError):
    """No usable platform: none installed or available, or an unknown name was asked for."""
