"""Argument types shared by slotwise's command-line tools, checked before any work."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def add_tp_argument(parser: argparse.ArgumentParser, command: str) -> None:
    """``--tp N``, the same for every command that can run tensor-parallel."""
    parser.add_argument(
        "--tp",
        type=int_at_least(1),
        default=1,
        help="tensor-parallel size (>= 1); run under torchrun with as many processes "
        f"(torchrun --nproc-per-node N -m slotwise {command} --tp N ...); rank 0 prints",
    )


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type refusing integers below ``minimum`` at parse time, before any
    model is built or compiled."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


def float_in(
    low: float, high: float = math.inf, *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse type accepting finite numbers from ``low`` (excluded with
    ``low_open``) to ``high``, refusing the rest (and nan) at parse time."""
    if high == math.inf:
        accepted = f"a number {'>' if low_open else '>='} {low:g}"
    else:
        accepted = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        too_low = value <= low if low_open else value < low
        if not math.isfinite(value) or too_low or value > high:
            raise argparse.ArgumentTypeError(f"expected {accepted}, got {text!r}")
        return value

    return parse
