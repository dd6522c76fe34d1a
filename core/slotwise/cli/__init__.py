"""The ``slotwise`` command line: one sub-command per module."""

from slotwise.cli.main import main

__all__ = ["main"]
