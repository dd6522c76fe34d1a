"""The commands the slotwise-engine distribution adds, and what to say when it is not
installed: ``slotwise generate`` without it names the distribution to install."""

from __future__ import annotations

ENGINE_DISTRIBUTION = "slotwise-engine"
#: The engine's import package, and so the root of its modules' loggers.
ENGINE_PACKAGE = "slotwise_engine"
#: The ``slotwise`` commands the engine distribution adds to the command line.
ENGINE_COMMANDS = ("generate", "bench", "serve")


def engine_missing_message(what: str) -> str:
    """One line: ``what`` is part of the engine distribution, and how to install it."""
    return (
        f"{what} is part of the {ENGINE_DISTRIBUTION} distribution, which is not "
        f"installed: pip install {ENGINE_DISTRIBUTION}"
    )
