"""Loading an entry point that importlib.metadata found, with a malformed value named.

Why: ``EntryPoint.load()`` answers a value its pattern does not match (``"not a
module!"``) with an AttributeError about a failed regular-expression match (Python
3.11), which tells the user nothing; this names the value and the fix instead.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any


def load_entry_point(ep: EntryPoint) -> Any:
    """The object ``ep``'s value (``"module"`` or ``"module:attr.attr"``) names."""
    if ep.pattern.match(ep.value) is None:
        raise ValueError(
            f"entry point value {ep.value!r} is not 'module' or 'module:attribute'; fix the "
            "entry point in the distribution's pyproject.toml and reinstall it"
        )
    return ep.load()
