"""Argument parsing and dispatch for the ``slotwise`` command.

How every command ends is decided here, once: a slotwise error is one line and exit
status 2; Ctrl-C, at any point of any command, is one line and exit status 130 (the
shell's 128 + SIGINT); a reader that stops early (``slotwise generate ... | head``)
ends the command quietly with exit status 141 (128 + SIGPIPE, what the shell reports
for any program a closed pipe stops).  No traceback for any of them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

from slotwise import envs
from slotwise.cli import (
    conformance_command,
    env_command,
    matrix_command,
    new_plugin_command,
)
from slotwise.cli.arguments import ArgumentParser
from slotwise.cli.command_entry_points import BrokenCommand, load_commands
from slotwise.errors import EnvironmentVariableError, SlotwiseError
from slotwise.missing_distribution import ENGINE_COMMANDS, engine_missing_message

#: The commands of the core; other distributions add theirs through entry points
#: (command_entry_points), slotwise-engine its ``generate`` and ``bench``.
BUILT_IN_COMMANDS: dict[str, ModuleType] = {
    "env": env_command,
    "matrix": matrix_command,
    "conformance": conformance_command,
    "new-plugin": new_plugin_command,
}

logger = logging.getLogger("slotwise")

#: Exit statuses of a command interrupted by Ctrl-C and of one whose stdout was closed.
INTERRUPTED = 128 + signal.SIGINT
BROKEN_PIPE = 128 + signal.SIGPIPE


def configure_logging() -> None:
    """Send the ``slotwise`` logger to stderr at SLOTWISE_LOGGING_LEVEL (default INFO)."""
    level = envs.logging_level()
    logger = logging.getLogger("slotwise")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s slotwise: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)


def all_commands() -> tuple[dict[str, ModuleType], list[BrokenCommand]]:
    """The built-in commands and those of the ``slotwise.cli_commands`` entry points,
    by name, and the entry points that could not be loaded."""
    added, broken = load_commands(BUILT_IN_COMMANDS)
    return {**BUILT_IN_COMMANDS, **added}, broken


def build_parser(commands: dict[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="slotwise", description="slotwise: hardware plugin framework for PyTorch inference"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in (all_commands()[0] if commands is None else commands).items():
        module.add_parser(subparsers, name)
    return parser


def _unavailable(
    argv: Sequence[str], commands: dict[str, ModuleType], broken: list[BrokenCommand]
) -> str | None:
    """Why the command ``argv`` asks for cannot run, when it is one that failed to load
    or one of a distribution that is not installed; None otherwise (argparse reports an
    unknown command with the list of the installed ones)."""
    requested = next((arg for arg in argv if not arg.startswith("-")), None)
    if requested is None or requested in commands:
        return None
    for command in broken:
        if command.name == requested:
            return command.reason
    if requested in ENGINE_COMMANDS:
        installed = ", ".join(sorted(commands))
        return f"{engine_missing_message(f'slotwise {requested}')} (installed: {installed})"
    return None


def main(argv: list[str] | None = None) -> int:
    prog = "slotwise"
    if sys.stdout is None:  # started with stdout closed (>&-): the answer goes nowhere
        sys.stdout = open(os.devnull, "w")
    try:
        try:
            envs.validate_all()  # before any work: a typo fails here in one line, not mid-run
        except EnvironmentVariableError as exc:
            print(f"slotwise: error: {exc}", file=sys.stderr)
            return 2
        configure_logging()
        commands, broken = all_commands()
        unavailable = _unavailable(sys.argv[1:] if argv is None else argv, commands, broken)
        if unavailable is not None:
            print(f"slotwise: error: {unavailable}", file=sys.stderr)
            return 2
        for command in broken:
            logger.warning("%s", command.reason)
        args = build_parser(commands).parse_args(argv)
        prog = f"slotwise {args.command}"
        try:
            code = commands[args.command].run(args)
        except SlotwiseError as exc:
            if _during_interrupt(exc):
                raise KeyboardInterrupt from exc
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:
            if _during_interrupt(exc):
                raise KeyboardInterrupt from exc
            raise
        sys.stdout.flush()  # here, where a closed pipe is handled, not at exit
        return code
    except KeyboardInterrupt:
        return _interrupted(prog)
    except BrokenPipeError:
        return _stdout_closed()


def _during_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a Ctrl-C was being handled (by a cleanup that
    failed because of it): the interrupt is what the user should hear about."""
    seen: set[int] = set()
    cause = exc.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False


def _interrupted(prog: str) -> int:
    # A second Ctrl-C while the interpreter shuts down (joining compile workers, say)
    # ends it at once, without a traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    print(f"{prog}: interrupted", file=sys.stderr)
    return INTERRUPTED


def _stdout_closed() -> int:
    """Quiet end for a reader that went away: what is still buffered for stdout goes to
    /dev/null, so the interpreter's own flush at exit cannot fail again and print."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE
