"""A plugin's ``requires_api`` range, read without ``packaging`` in the usual case.

Every process that resolves a platform checks each plugin's range against the API
version, and importing ``packaging.specifiers`` is about a fifth of what ``import
slotwise`` plus resolution costs. The ranges plugins write (``>=1.1,<2``: the bundled
plugins, the ``new-plugin`` template and the docs) are comparisons with plain release
numbers, and slotwise's API versions are plain ``MAJOR.MINOR`` releases; for those,
PEP 440's comparisons are comparisons of the zero-padded numbers, done here. Any other
range (``~=``, wildcards, pre-releases) goes to ``packaging``, which stays the reference.
"""

from __future__ import annotations

import re
from typing import Any

#: Operators that put a ceiling on the versions a range admits.
UPPER_BOUNDS = frozenset({"<", "<=", "==", "===", "~="})

_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")
_RELEASE = re.compile(r"^\d+(?:\.\d+)*$")


class ApiRange:
    """A parsed ``requires_api``; raises ``packaging``'s ``InvalidSpecifier`` (a
    ``ValueError``) for text that is no PEP 440 specifier."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._clauses = _plain_clauses(text)
        self._specifiers: Any = None if self._clauses is not None else _specifier_set(text)

    @property
    def operators(self) -> list[str]:
        if self._clauses is not None:
            return [operator for operator, _ in self._clauses]
        return [specifier.operator for specifier in self._specifiers]

    @property
    def has_upper_bound(self) -> bool:
        return any(operator in UPPER_BOUNDS for operator in self.operators)

    def contains(self, version: str) -> bool:
        if self._clauses is None or not _RELEASE.match(version):
            specifiers = self._specifiers or _specifier_set(self._text)
            return bool(specifiers.contains(version, prereleases=True))
        number = _release(version)
        return all(_COMPARE[operator](number, bound) for operator, bound in self._clauses)


def _plain_clauses(text: str) -> list[tuple[str, tuple[int, ...]]] | None:
    """The comparisons of ``text`` when all are with plain release numbers, else None."""
    if not isinstance(text, str) or not text.strip():
        return None
    clauses = []
    for part in text.split(","):
        match = _CLAUSE.match(part)
        if match is None:
            return None
        clauses.append((match.group(1), _release(match.group(2))))
    return clauses


def _release(text: str) -> tuple[int, ...]:
    """The release numbers without trailing zeros: PEP 440 pads the shorter with zeros."""
    numbers = [int(part) for part in text.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def _specifier_set(text: str) -> Any:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(text)


_COMPARE = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
