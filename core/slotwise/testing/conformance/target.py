"""The platform under test, and failure messages that name it.

The pytest plugin sets ``SLOTWISE_PLATFORM`` from ``--slotwise-platform`` and
resolves the platform before collection, so a check only reads what is set; a
suite module run without the plugin fails here with the command to use instead.
"""

from __future__ import annotations

from typing import NoReturn

import pytest

from slotwise import envs
from slotwise.platforms import Platform, get_current_platform


def platform_name() -> str:
    """The name given with ``--slotwise-platform``."""
    name = envs.get("SLOTWISE_PLATFORM")
    if name is None:
        pytest.fail(
            "the conformance suite runs as `pytest --slotwise-conformance "
            "--slotwise-platform=NAME` (or `slotwise conformance NAME`)",
            pytrace=False,
        )
    return name


def platform() -> Platform:
    """The platform object of this process, resolved from ``SLOTWISE_PLATFORM``."""
    platform_name()
    return get_current_platform()


def fail(problem: str) -> NoReturn:
    """Fail the running check with ``problem``, prefixed by the platform's name.

    No traceback, and not the exception being handled either: the message alone says
    what is wrong, and it is what the summary of ``slotwise conformance`` shows.
    """
    raise pytest.fail.Exception(f"platform {platform_name()!r}: {problem}", pytrace=False) from None


def skip(reason: str) -> NoReturn:
    """Skip the running check, naming the platform in the reason."""
    pytest.skip(f"platform {platform_name()!r}: {reason}")
