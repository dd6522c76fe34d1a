"""Argument parsing and dispatch for the ``slotwise`` command.

How every command ends is decided here, once, without a traceback: a slotwise error
exits 2, Ctrl-C 130 (128 + SIGINT), a closed stdout quietly 141 (128 + SIGPIPE); a
plugin's non-daemon thread does not keep the command from ending.  Only the module of
the command asked for is imported.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import Any, TextIO

from slotwise import envs
from slotwise.cli.arguments import ArgumentParser
from slotwise.cli.command_entry_points import (
    BuiltInCommand,
    Command,
    CommandError,
    add_command_parser,
    find_commands,
    load_command,
)
from slotwise.cli.engine_distribution import (
    ENGINE_COMMANDS,
    ENGINE_PACKAGE,
    engine_missing_message,
)
from slotwise.errors import EnvironmentVariableError, SlotwiseError
from slotwise.plugins.plugin_code import lingering_plugin_threads

#: The commands of the core; other distributions add theirs through entry points
#: (command_entry_points), slotwise-engine its ``generate`` and ``bench``.
BUILT_IN_COMMANDS: dict[str, BuiltInCommand] = {
    "env": BuiltInCommand(
        "slotwise.cli.env_command", "show versions, plugins, the selected platform"
    ),
    "matrix": BuiltInCommand(
        "slotwise.cli.matrix_command",
        "show what every installed platform supports (graph modes, attention, ...)",
    ),
    "conformance": BuiltInCommand(
        "slotwise.cli.conformance_command",
        "check a platform plugin with slotwise's conformance suite",
    ),
    "new-plugin": BuiltInCommand(
        "slotwise.cli.new_plugin_command",
        "write a new platform plugin package that passes the conformance suite",
    ),
}

#: Seconds a finished command waits for the non-daemon threads plugins started.
PLUGIN_THREAD_GRACE_S = 1.0

logger = logging.getLogger(__name__)

#: Exit statuses of a command interrupted by Ctrl-C and of one whose stdout was closed.
INTERRUPTED = 128 + signal.SIGINT
BROKEN_PIPE = 128 + signal.SIGPIPE


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record comes, not as it was when the
    handler was made: ``main`` called from Python under a redirected or captured stderr
    must not leave a handler on a stream closed since."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current sys.stderr


#: The loggers the commands set up: the parents of every module's of the core and the engine.
COMMAND_LOGGERS = ("slotwise", ENGINE_PACKAGE)


def configure_logging() -> None:
    """Send the ``slotwise`` and ``slotwise_engine`` loggers, the parents of every
    module's, to stderr at SLOTWISE_LOGGING_LEVEL (default INFO)."""
    level = envs.logging_level()
    for name in COMMAND_LOGGERS:
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s slotwise: %(message)s"))
            logger.addHandler(handler)
            logger.propagate = False
        logger.setLevel(level)


def build_parser(
    commands: dict[str, Command] | None = None, loaded: dict[str, ModuleType] | None = None
) -> argparse.ArgumentParser:
    """The ``slotwise`` parser, listing every command of ``commands`` (default: all); only
    those in ``loaded`` (name -> module; default: all imported) get their options."""
    if commands is None:
        commands = find_commands(BUILT_IN_COMMANDS)[0]
    if loaded is None:
        loaded = {name: load_command(command) for name, command in commands.items()}
    parser = ArgumentParser(
        prog="slotwise", description="slotwise: hardware plugin framework for PyTorch inference"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in commands.items():
        if name in loaded:
            add_command_parser(command, loaded[name], subparsers)
        else:
            subparsers.add_parser(name, help=command.help)
    return parser


def _requested(argv: Sequence[str]) -> str | None:
    """The command ``argv`` asks for: its first argument that is not an option (the
    ``slotwise`` parser itself has none but ``--help``)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _unavailable(requested: str | None, commands: dict[str, Command]) -> str | None:
    """Why the command asked for cannot run when it is one of a distribution that is not
    installed; None otherwise (argparse reports an unknown command with the list of the
    installed ones)."""
    if requested is None or requested in commands or requested not in ENGINE_COMMANDS:
        return None
    installed = ", ".join(sorted(commands))
    return f"{engine_missing_message(f'slotwise {requested}')} (installed: {installed})"


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` asks for (default: this process's command line, ending the
    process itself if a plugin's thread would keep it alive) and return its exit status."""
    if argv is not None:
        return _main(argv)
    try:
        code = _main(None)
    except Exception:
        # The interpreter would print the traceback, exit with status 1, and first wait.
        _exit_despite_plugin_threads(1, traceback.format_exc())
        raise
    _exit_despite_plugin_threads(code)
    return code


def _main(argv: list[str] | None) -> int:
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
        commands, problems = find_commands(BUILT_IN_COMMANDS)
        for problem in problems:
            logger.warning("%s", problem)
        requested = _requested(sys.argv[1:] if argv is None else argv)
        unavailable = _unavailable(requested, commands)
        if unavailable is not None:
            print(f"slotwise: error: {unavailable}", file=sys.stderr)
            return 2
        try:
            loaded = {requested: load_command(commands[requested])} if requested in commands else {}
            parser = build_parser(commands, loaded)
        except CommandError as exc:
            print(f"slotwise: error: {exc}", file=sys.stderr)
            return 2
        args = parser.parse_args(argv)
        prog = f"slotwise {args.command}"
        try:
            code = loaded[args.command].run(args)
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
    # CPython remembers a KeyboardInterrupt that left code run by exec() of a string
    # (torch runs code it generates that way) even once caught, and under `python -m`
    # ends the process by SIGINT instead of with the status returned; a string exec
    # that completes clears that memory, so the status is 130 however Ctrl-C landed.
    exec("")
    return INTERRUPTED


def _stdout_closed() -> int:
    """Quiet end for a reader that went away: what is still buffered for stdout goes to
    /dev/null, so the interpreter's own flush at exit cannot fail again and print."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE


def _exit_despite_plugin_threads(code: int, traceback_text: str = "") -> None:
    """End the process with ``code`` now if a non-daemon thread started by plugin code is
    still running (the interpreter would wait for it forever), doing what exit does first:
    the uncaught error's traceback, atexit handlers, flushed streams."""
    lingering = lingering_plugin_threads(PLUGIN_THREAD_GRACE_S)
    if not lingering:
        return
    sys.stderr.write(traceback_text)
    logger.warning(
        "%s: it is still running and would keep slotwise from exiting, so slotwise exits "
        "without it. Plugin threads must be daemon threads (daemon=True) or end by "
        "themselves: fix or uninstall the plugin.",
        "; ".join(lingering),
    )
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed pipe or closed stream: nothing more to say
            pass
    os._exit(code)
