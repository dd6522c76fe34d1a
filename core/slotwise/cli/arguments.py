"""Argument types shared by slotwise's command-line tools, checked before any work.

Every number has a lower and an upper bound: a value past what torch or the machine
can take (a seed of 2**64, a tensor sized 10**30, a million threads) is refused here in
one line, never met later as an overflow deep in torch.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import NoReturn

#: Bound of token counts and positions: sizes that fit the int32 tensors they index.
MAX_TOKENS = 2**31 - 1
#: Largest tensor-parallel size: far past any machine, well inside every integer type.
MAX_TP = 1024


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, reporting a bad argument in one line (with where to look for
    the right ones) instead of the usage block, which would bury the reason."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def add_tp_argument(parser: argparse.ArgumentParser, command: str) -> None:
    """``--tp N``, the same for every command that can run tensor-parallel."""
    parser.add_argument(
        "--tp",
        type=int_in(1, MAX_TP),
        default=1,
        help=f"tensor-parallel size (1 to {MAX_TP}); run under torchrun with as many processes "
        f"(torchrun --nproc-per-node N -m slotwise {command} --tp N ...); rank 0 prints",
    )


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type accepting the integers from ``low`` to ``high``, refusing the rest
    at parse time, before any model is built or compiled."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:  # not a number, or more digits than int() reads
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {low} to {high}, got {_shown(text)}"
            )
        return value

    return parse


def float_in(
    low: float, high: float, *, low_open: bool = False, zero: bool = False
) -> Callable[[str], float]:
    """An argparse type accepting finite numbers from ``low`` (excluded with
    ``low_open``) to ``high``, and 0 too with ``zero``, refusing the rest (and nan)."""
    accepted = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
    if zero:
        accepted = f"0 or {accepted}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        too_low = value <= low if low_open else value < low
        if zero and value == 0:
            return 0.0
        if not math.isfinite(value) or too_low or value > high:
            raise argparse.ArgumentTypeError(f"expected {accepted}, got {_shown(text)}")
        return value

    return parse


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def utf8_text(text: str) -> str:
    """An argparse type refusing text that is not valid UTF-8.

    Python hands undecodable bytes of argv over as lone surrogates (``\\udcff``), which
    would fail later, in the tokenizer or on the way to stdout, as a traceback.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        # surrogateescape maps byte b to U+DC00 + b.
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise argparse.ArgumentTypeError(
            f"not valid UTF-8 ({what} at character {exc.start}); pass UTF-8 text"
        ) from None
    return text


def _shown(text: str) -> str:
    """``text`` as an error quotes it: repr'd, its middle cut when it is long."""
    shown = repr(text)
    return shown if len(shown) <= 40 else f"{shown[:18]}...{shown[-18:]}"
