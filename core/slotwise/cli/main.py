"""Argument parsing and dispatch for the ``slotwise`` command."""

from __future__ import annotations

import argparse
import logging
import sys

from slotwise import envs
from slotwise.cli import (
    bench_command,
    conformance_command,
    env_command,
    generate_command,
    matrix_command,
    new_plugin_command,
)
from slotwise.errors import EnvironmentVariableError, SlotwiseError

SUBCOMMANDS = {
    "env": env_command,
    "bench": bench_command,
    "generate": generate_command,
    "matrix": matrix_command,
    "conformance": conformance_command,
    "new-plugin": new_plugin_command,
}


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slotwise", description="slotwise: hardware plugin framework for PyTorch inference"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        module.add_parser(commands, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        envs.validate_all()  # before any work: a typo fails here in one line, not mid-run
    except EnvironmentVariableError as exc:
        print(f"slotwise: error: {exc}", file=sys.stderr)
        return 2
    configure_logging()
    args = build_parser().parse_args(argv)
    try:
        return SUBCOMMANDS[args.command].run(args)
    except SlotwiseError as exc:
        print(f"slotwise {args.command}: error: {exc}", file=sys.stderr)
        return 2
