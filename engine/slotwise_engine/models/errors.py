"""The error of a checkpoint slotwise cannot load; importing it costs nothing (no torch)."""

from __future__ import annotations

from slotwise.errors import SlotwiseError


class CheckpointError(SlotwiseError, ValueError):
    """A checkpoint folder cannot be loaded as it is: a missing, corrupt or inconsistent
    file, a tensor that does not fit the model its config.json describes, or a feature
    slotwise does not implement.  The message names the file (and tensor) and the fix.
    """
