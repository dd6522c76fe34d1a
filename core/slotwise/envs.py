"""Environment variables that steer slotwise, read when used (never cached at import)."""

from __future__ import annotations

import os

#: Every variable slotwise reads, with what it does; `slotwise env` and docs list them.
ENVIRONMENT_VARIABLES: dict[str, str] = {
    "SLOTWISE_PLATFORM": "select a platform by name instead of the highest-priority one",
    "SLOTWISE_PLUGINS": "comma-separated allow-list of plugin entry-point names to load",
    "SLOTWISE_STRICT_PLUGINS": "1: a broken plugin is an error instead of a warning",
    "SLOTWISE_COMPILATION_CONFIG": "compilation config as a JSON object or a JSON file path",
    "SLOTWISE_DISABLE_COMPILE_CACHE": "1: never read or write the persistent compile cache",
    "SLOTWISE_CACHE_ROOT": "compile cache folder (default ~/.cache/slotwise/compile)",
    "SLOTWISE_ATTENTION_BACKEND": "override the platform's choice of attention backend",
    "SLOTWISE_LOGGING_LEVEL": "level of the 'slotwise' logger in the CLI (default INFO)",
    "SLOTWISE_DIST_TIMEOUT": "seconds before a stuck rendezvous or collective fails (default 600)",
}


def get(name: str) -> str | None:
    """Value of a slotwise variable, ``None`` when unset or empty."""
    assert name in ENVIRONMENT_VARIABLES, f"undocumented slotwise variable {name}"
    value = os.environ.get(name, "").strip()
    return value or None


def flag(name: str) -> bool:
    """True for 1/true/yes/on; a typo in a boolean flag is an error, not a silent no."""
    value = get(name)
    if value is None:
        return False
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r} is not a boolean; use 1 or 0")


def name_list(name: str) -> list[str] | None:
    """A comma-separated list, or ``None`` when the variable is unset."""
    value = get(name)
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]
