"""The plugin API's surface as data: every name of ``slotwise.plugin_api`` with its
signature, so a test can tell when the API changed.

    python -m slotwise.testing.api_surface --write tests/versioning/plugin_api_surface.json

regenerates the snapshot after a deliberate change (with ``API_VERSION`` changed to
match, see docs/api-versioning.md).
"""

from __future__ import annotations

import argparse
import enum
import inspect
import json
from pathlib import Path
from typing import Any

from slotwise import plugin_api
from slotwise.plugins import hookspecs

_PLAIN = (str, int, float, bool, type(None))


def surface() -> dict[str, Any]:
    """The whole plugin API: its version, the hooks a plugin implements and the names it
    imports, each with its signature."""
    names = {name: describe(getattr(plugin_api, name)) for name in plugin_api.__all__}
    hooks = {
        name: _signature(function)
        for name, function in vars(hookspecs).items()
        if name.startswith("slotwise_") and callable(function)
    }
    return {"api_version": names.pop("API_VERSION")["value"], "hooks": hooks, "names": names}


def describe(value: Any) -> dict[str, Any]:
    """What a plugin relies on in ``value``: a signature, members, or a plain value."""
    if isinstance(value, type) and issubclass(value, enum.Enum):
        return {"kind": "enum", "members": [member.name for member in value]}
    if isinstance(value, type):
        return {"kind": "class", "members": _class_members(value)}
    if callable(value):
        return {"kind": "function", "signature": _signature(value)}
    return {"kind": "value", "value": value if isinstance(value, _PLAIN) else repr(value)}


def _class_members(cls: type) -> dict[str, str]:
    """Public members defined by slotwise classes in ``cls``'s MRO (torch's are not ours)."""
    members: dict[str, str] = {}
    for owner in reversed(cls.__mro__):
        if not owner.__module__.startswith("slotwise"):
            continue
        for name, member in vars(owner).items():
            if name.startswith("_") and name not in ("__init__", "__call__"):
                continue
            members[name] = _member(member)
    return dict(sorted(members.items()))


def _member(member: Any) -> str:
    if isinstance(member, (staticmethod, classmethod)):
        return f"{type(member).__name__}{_signature(member.__func__)}"
    if isinstance(member, property):
        return "property"
    if callable(member):
        return f"method{_signature(member)}"
    if isinstance(member, _PLAIN):
        return f"= {member!r}"
    return f": {type(member).__name__}"


def _signature(function: Any) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):  # a builtin without introspectable arguments
        return "(...)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the snapshot here instead of printing")
    args = parser.parse_args()
    text = json.dumps(surface(), indent=1, sort_keys=True) + "\n"
    if args.write:
        args.write.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
