"""The ``slotwise`` commands other distributions add, found through entry points.

A distribution declares a command in the ``slotwise.cli_commands`` entry-point group:
the entry point's name is the command, its value a module with
``add_parser(commands, name)`` and ``run(args) -> int``, the protocol of the built-in
commands.  A command that fails to load is reported, with its distribution and the
fix, and leaves the other commands working.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from types import ModuleType

from slotwise.plugins.entry_point_loading import load_entry_point

COMMAND_GROUP = "slotwise.cli_commands"


@dataclass
class BrokenCommand:
    """A command whose entry point could not be used, and why, in one line."""

    name: str
    reason: str


def load_commands(
    built_in: dict[str, ModuleType],
) -> tuple[dict[str, ModuleType], list[BrokenCommand]]:
    """The commands of the entry-point group, by name, and those that failed to load.

    A name taken by a built-in command or by an earlier entry point (of another
    distribution: importlib.metadata lists one found twice on ``sys.path`` once) is not
    loaded again.
    """
    commands: dict[str, ModuleType] = {}
    broken: list[BrokenCommand] = []
    for ep in importlib.metadata.entry_points(group=COMMAND_GROUP):
        if ep.name in commands or any(b.name == ep.name for b in broken):
            continue
        if ep.name in built_in:
            broken.append(
                BrokenCommand(
                    ep.name,
                    f"{_source(ep)} declares the command {ep.name!r}, which slotwise has "
                    "built in; rename its entry point",
                )
            )
            continue
        try:
            module = load_entry_point(ep)
        except Exception as exc:  # noqa: BLE001 - one broken command must not break the rest
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            broken.append(BrokenCommand(ep.name, _unusable(ep, f"failed to load: {reason}")))
            continue
        missing = [
            name for name in ("add_parser", "run") if not callable(getattr(module, name, None))
        ]
        if missing:
            broken.append(
                BrokenCommand(ep.name, _unusable(ep, f"{ep.value!r} has no {' or '.join(missing)}"))
            )
            continue
        commands[ep.name] = module
    return commands, broken


def _source(ep: importlib.metadata.EntryPoint) -> str:
    name = getattr(ep.dist, "name", None)
    version = getattr(ep.dist, "version", None)
    if name is None:
        return "a distribution with no name"
    return f"distribution {name} {version}" if version else f"distribution {name}"


def _unusable(ep: importlib.metadata.EntryPoint, why: str) -> str:
    dist = getattr(ep.dist, "name", None) or "the distribution that declares it"
    return (
        f"command {ep.name!r} of {_source(ep)} is unusable ({why}); reinstall {dist} "
        f"(pip install --force-reinstall {dist}) or uninstall it"
    )
