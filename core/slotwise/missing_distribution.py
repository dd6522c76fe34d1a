"""What the slotwise-engine distribution adds, and the error when it is not installed.

The engine's modules (``slotwise.models``, ``slotwise.runner``, ...) join the ``slotwise``
package from their own distribution.  Without it, importing one of them would fail as
an unknown module; the finder here, last on ``sys.meta_path`` so that it answers only
when no real finder found the module, says instead which distribution to install.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import ModuleType

ENGINE_DISTRIBUTION = "slotwise-engine"
#: Top-level modules of the ``slotwise`` package that the engine distribution provides.
ENGINE_MODULES = frozenset(
    {
        "slotwise.models",
        "slotwise.runner",
        "slotwise.decode_benchmark",
        "slotwise.startup_benchmark",
        "slotwise.engine_cli",
    }
)
#: The ``slotwise`` commands the engine distribution adds to the command line.
ENGINE_COMMANDS = ("generate", "bench")


def engine_missing_message(what: str) -> str:
    """One line: ``what`` is part of the engine distribution, and how to install it."""
    return (
        f"{what} is part of the {ENGINE_DISTRIBUTION} distribution, which is not "
        f"installed: pip install {ENGINE_DISTRIBUTION}"
    )


class MissingEngineFinder:
    """A ``sys.meta_path`` finder that fails the import of an engine module with a
    ``ModuleNotFoundError`` naming the distribution to install."""

    @staticmethod
    def find_spec(
        fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> None:
        top = ".".join(fullname.split(".")[:2])
        if top in ENGINE_MODULES:
            raise ModuleNotFoundError(engine_missing_message(top), name=fullname)
        return None


def install_missing_engine_finder() -> None:
    """Append the finder to ``sys.meta_path``, once."""
    if not any(isinstance(finder, MissingEngineFinder) for finder in sys.meta_path):
        sys.meta_path.append(MissingEngineFinder())
