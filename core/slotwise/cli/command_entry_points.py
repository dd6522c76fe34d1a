"""The ``slotwise`` commands: slotwise's own and those other distributions add through
entry points, known from metadata alone.

An entry point in ``slotwise.cli_commands`` names the command and a module with
``add_parser(commands, name)`` and ``run(args) -> int``.  Only the module asked for is
imported, with stdout on stderr, and whatever it raises is one error naming its
distribution; a name declared twice is warned about.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from types import ModuleType
from typing import Any, NamedTuple

import slotwise
from slotwise.cli.engine_distribution import ENGINE_COMMANDS, ENGINE_DISTRIBUTION
from slotwise.errors import SlotwiseError
from slotwise.plugins.entry_point_loading import load_entry_point
from slotwise.plugins.plugin_code import describe, stdout_to_stderr

COMMAND_GROUP = "slotwise.cli_commands"


class BuiltInCommand(NamedTuple):
    """A command of slotwise itself: its module, and its line in ``slotwise --help``."""

    module: str
    help: str


@dataclass(frozen=True)
class Command:
    """A ``slotwise`` command, known without importing its module."""

    name: str
    entry_point: EntryPoint
    distribution: str
    version: str
    help: str

    @property
    def source(self) -> str:
        return f"distribution {self.distribution} {self.version}"


class CommandError(SlotwiseError):
    """A command cannot be used; the message names its distribution and the fix."""


def find_commands(
    built_in: Mapping[str, BuiltInCommand],
) -> tuple[dict[str, Command], list[str]]:
    """Every command by name, from entry-point metadata (no command module imported), and
    what is wrong with the installation: names taken twice, each a warning."""
    commands = {
        name: Command(
            name,
            EntryPoint(name, command.module, COMMAND_GROUP),
            "slotwise",
            slotwise.__version__,
            command.help,
        )
        for name, command in built_in.items()
    }
    declared: dict[str, list[EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=COMMAND_GROUP):
        declared.setdefault(ep.name, []).append(ep)
    problems = []
    for name, eps in declared.items():
        if name in built_in:
            problems += [
                f"{_source(ep)} declares the command {name!r}, which slotwise has built in; "
                "rename its entry point"
                for ep in eps
            ]
            continue
        chosen = _preferred(name, eps)
        if len(eps) > 1:
            problems.append(_declared_twice_message(name, chosen, eps))
        distribution = _distribution_name(chosen) or "a distribution with no name"
        commands[name] = Command(
            name,
            chosen,
            distribution,
            getattr(chosen.dist, "version", None) or "?",
            f"from {distribution}; 'slotwise {name} --help' for its options",
        )
    return commands, problems


def load_command(command: Command) -> ModuleType:
    """The module of ``command``, imported now; raises ``CommandError`` when it fails to
    import or lacks the command protocol."""
    with _guarded(command, "failed to load"):
        module = load_entry_point(command.entry_point)
    missing = [name for name in ("add_parser", "run") if not callable(getattr(module, name, None))]
    if missing:
        raise CommandError(
            _unusable(command, f"{command.entry_point.value!r} has no {' or '.join(missing)}")
        )
    return module


def add_command_parser(command: Command, module: ModuleType, subparsers: Any) -> None:
    """``module.add_parser(subparsers, name)``; raises ``CommandError`` when it fails."""
    with _guarded(command, "add_parser failed"):
        module.add_parser(subparsers, command.name)


@contextlib.contextmanager
def _guarded(command: Command, failure: str) -> Iterator[None]:
    """Run a command module's code: stdout to stderr, any failure but Ctrl-C a
    ``CommandError`` that starts with ``failure``."""
    try:
        with stdout_to_stderr():
            yield
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        code = "" if exc.code is None else repr(exc.code)
        raise CommandError(_unusable(command, f"{failure}: called sys.exit({code})")) from exc
    except Exception as exc:
        raise CommandError(_unusable(command, f"{failure}: {describe(exc)}")) from exc


def _preferred(name: str, eps: list[EntryPoint]) -> EntryPoint:
    """Of the entry points declaring ``name``: the engine's for its own commands, else the
    first (the first found on ``sys.path``)."""
    if name in ENGINE_COMMANDS:
        for ep in eps:
            if _normalized(_distribution_name(ep)) == ENGINE_DISTRIBUTION:
                return ep
    return eps[0]


def _declared_twice_message(name: str, chosen: EntryPoint, eps: list[EntryPoint]) -> str:
    sources = " and ".join(_source(ep) for ep in eps)
    others = ", ".join(_distribution_name(ep) or "?" for ep in eps if ep is not chosen)
    return (
        f"the command {name!r} is declared by {sources}; slotwise runs the one of "
        f"{_source(chosen)}. Uninstall {others} or rename its entry point"
    )


def _distribution_name(ep: EntryPoint) -> str | None:
    return getattr(ep.dist, "name", None)


def _normalized(name: str | None) -> str:
    """A distribution name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name or "").lower()


def _source(ep: EntryPoint) -> str:
    name = _distribution_name(ep)
    version = getattr(ep.dist, "version", None)
    if name is None:
        return "a distribution with no name"
    return f"distribution {name} {version}" if version else f"distribution {name}"


def _unusable(command: Command, why: str) -> str:
    dist = command.distribution
    return (
        f"command {command.name!r} of {command.source} is unusable ({why}); reinstall {dist} "
        f"(pip install --force-reinstall {dist}) or uninstall it"
    )
