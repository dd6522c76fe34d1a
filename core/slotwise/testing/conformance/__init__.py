"""The platform conformance suite: the checks every slotwise platform plugin should pass.

A vendor runs it in their own CI, against their platform, in one of two ways::

    pytest --slotwise-conformance --slotwise-platform=NAME
    slotwise conformance NAME

Each check is one test module here, ``test_<check>.py``, collected by the pytest
plugin ``slotwise.testing.pytest_plugin`` only when ``--slotwise-conformance`` is
given.  Importing this package is cheap (no torch): the plugin needs its location
before any test runs.  docs/conformance.md describes the checks.
"""

from __future__ import annotations

from pathlib import Path

#: The checks, in the order they run: cheap, fundamental ones first.
CHECKS = (
    "loading",
    "interface",
    "probe",
    "device",
    "attention",
    "custom_ops",
    "compile",
    "static_graphs",
    "communicator",
)

#: The folder holding the suite's test modules.
SUITE_DIRECTORY = Path(__file__).resolve().parent


def check_of(path: Path) -> str | None:
    """The check a test file belongs to, or None when it is not one of the suite's."""
    path = Path(path).resolve()
    if path.parent != SUITE_DIRECTORY:
        return None
    check = path.stem.removeprefix("test_")
    return check if check in CHECKS else None
