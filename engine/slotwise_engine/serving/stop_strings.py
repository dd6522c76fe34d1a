"""Finding stop strings in text that grows piece by piece.

A stop string may span tokens (" Hel" + "lo" for "Hello"), so each new piece is searched
together with the tail of the text before it, and the end of the text that may still
become a stop string is held back from what is released.
"""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    """Where the first stop string that ends at or after ``start`` begins, or None.

    Only stop strings ending at ``start`` or later are new: the text before was searched.
    """
    found = None
    for stop in stops:
        at = text.find(stop, max(0, start - len(stop) + 1))
        if at >= 0 and (found is None or at < found):
            found = at
    return found


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` are the start of a stop string."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest
