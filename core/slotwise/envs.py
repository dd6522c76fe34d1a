"""Environment variables that steer slotwise, read when used (never cached at import).

Every accessor checks the value it reads and raises ``EnvironmentVariableError`` naming
the variable, the value and the accepted values; ``validate_all()`` runs them all up
front, so a typo fails at start-up in one line instead of deep inside a forward pass.
"""

from __future__ import annotations

import math
import os

from slotwise.errors import EnvironmentVariableError

#: Every variable slotwise reads, with what it does; `slotwise env` and docs list them.
ENVIRONMENT_VARIABLES: dict[str, str] = {
    "SLOTWISE_PLATFORM": "select a platform by name instead of the highest-priority one",
    "SLOTWISE_PLUGINS": "comma-separated allow-list of plugin entry-point names to load "
    "(unset: every plugin; set but empty: none)",
    "SLOTWISE_STRICT_PLUGINS": "1: a broken plugin is an error instead of a warning",
    "SLOTWISE_PROBE_TIMEOUT": "seconds a platform probe may take before it counts as failed "
    "(default 10)",
    "SLOTWISE_PLUGIN_TIMEOUT": "seconds a plugin's import or one of its hooks may take before "
    "the plugin counts as failed (default 30)",
    "SLOTWISE_COMPILATION_CONFIG": "compilation config as a JSON object or a JSON file path",
    "SLOTWISE_DISABLE_COMPILE_CACHE": "1: never read or write the persistent compile cache",
    "SLOTWISE_CACHE_ROOT": "compile cache folder (default ~/.cache/slotwise/compile)",
    "SLOTWISE_ATTENTION_BACKEND": "override the platform's choice of attention backend",
    "SLOTWISE_LOGGING_LEVEL": "level of the 'slotwise' and 'slotwise_engine' loggers in the CLI "
    "(default INFO)",
    "SLOTWISE_DIST_TIMEOUT": "seconds before a stuck rendezvous or collective fails (default 600)",
    "SLOTWISE_DISABLE_WARM_START": "1: always trace with Dynamo, never rebuild a model from "
    "its saved trace",
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
LOGGING_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_PROBE_TIMEOUT_S = 10.0
MAX_PROBE_TIMEOUT_S = 3600.0
DEFAULT_PLUGIN_TIMEOUT_S = 30.0
MAX_PLUGIN_TIMEOUT_S = 3600.0
DEFAULT_DIST_TIMEOUT_S = 600.0
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600.0  # a week: beyond it, timedelta and NCCL overflow


def get(name: str) -> str | None:
    """Value of a slotwise variable, ``None`` when unset or empty."""
    assert name in ENVIRONMENT_VARIABLES, f"undocumented slotwise variable {name}"
    value = os.environ.get(name, "").strip()
    return value or None


def settings() -> dict[str, str]:
    """Every SLOTWISE_* variable now set, to notice (and undo) a plugin changing one."""
    return {name: value for name, value in os.environ.items() if name.startswith("SLOTWISE_")}


def _invalid(name: str, value: str, problem: str, accepted: str) -> EnvironmentVariableError:
    return EnvironmentVariableError(
        f"{name}={value!r} is {problem}; accepted values: {accepted}. Fix or unset {name}."
    )


def flag(name: str) -> bool:
    """True for 1/true/yes/on; a typo in a boolean flag is an error, not a silent no."""
    value = get(name)
    if value is None:
        return False
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise _invalid(name, value, "not a boolean", ", ".join(_TRUE + _FALSE))


def positive_float(name: str, default: float, maximum: float) -> float:
    """A finite number in (0, maximum], ``default`` when unset; "nan" or "1e300" is an error."""
    value = get(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= maximum):
        raise _invalid(
            name,
            value,
            "not a usable number of seconds",
            f"a number > 0 and <= {maximum:g} (default {default:g})",
        )
    return number


def probe_timeout() -> float:
    """SLOTWISE_PROBE_TIMEOUT: seconds resolution waits for one platform's probe."""
    return positive_float("SLOTWISE_PROBE_TIMEOUT", DEFAULT_PROBE_TIMEOUT_S, MAX_PROBE_TIMEOUT_S)


def plugin_timeout() -> float:
    """SLOTWISE_PLUGIN_TIMEOUT: seconds slotwise waits for a plugin's import or one hook."""
    return positive_float("SLOTWISE_PLUGIN_TIMEOUT", DEFAULT_PLUGIN_TIMEOUT_S, MAX_PLUGIN_TIMEOUT_S)


def dist_timeout() -> float:
    """SLOTWISE_DIST_TIMEOUT: seconds a rendezvous or collective may take."""
    return positive_float("SLOTWISE_DIST_TIMEOUT", DEFAULT_DIST_TIMEOUT_S, MAX_DIST_TIMEOUT_S)


def logging_level() -> str:
    """SLOTWISE_LOGGING_LEVEL as an upper-case level name (default INFO), any case accepted."""
    value = get("SLOTWISE_LOGGING_LEVEL")
    if value is None:
        return "INFO"
    if value.upper() not in LOGGING_LEVELS:
        raise _invalid(
            "SLOTWISE_LOGGING_LEVEL",
            value,
            "not a logging level",
            ", ".join(LOGGING_LEVELS) + " (any case)",
        )
    return value.upper()


def name_list(name: str) -> list[str] | None:
    """A comma-separated list; ``None`` when the variable is unset, ``[]`` when it is set
    but names nothing (``SLOTWISE_PLUGINS=''`` allows no plugin, as vLLM's VLLM_PLUGINS)."""
    assert name in ENVIRONMENT_VARIABLES, f"undocumented slotwise variable {name}"
    value = os.environ.get(name)
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def validate_all() -> None:
    """Check every variable whose value has a fixed form; raise on the first bad one (the
    others are checked against what is installed where they are used)."""
    flag("SLOTWISE_STRICT_PLUGINS")
    flag("SLOTWISE_DISABLE_COMPILE_CACHE")
    flag("SLOTWISE_DISABLE_WARM_START")
    logging_level()
    probe_timeout()
    plugin_timeout()
    dist_timeout()
