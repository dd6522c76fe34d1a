"""The root of slotwise's own exceptions, so callers (and the CLI) can catch them all."""

from __future__ import annotations


class SlotwiseError(Exception):
    """Base of every error slotwise raises on purpose, each naming the problem and the fix."""


class EnvironmentVariableError(SlotwiseError, ValueError):
    """A SLOTWISE_* variable holds a value slotwise cannot use; the message names the fix.

    A ValueError too, so code that caught the ValueError of a bad value keeps working.
    """
