"""Choosing the platform of this process from the plugins' ``PlatformSpec``s.

Rules, in order (docs/design.md):
1. ``SLOTWISE_PLATFORM=name`` selects that platform or raises; never a fallback.
2. Else the available, API-compatible platform of highest priority; a tie at the
   top is an error naming both plugins.
3. Else an ``UnspecifiedPlatform`` that raises ``PlatformNotFoundError`` on use.

Each probe runs at most once per process, within SLOTWISE_PROBE_TIMEOUT seconds, and
only when a selection or a report needs its answer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from slotwise import envs, version
from slotwise.import_path import resolve_import_path
from slotwise.platforms.errors import PlatformError, PlatformNotFoundError
from slotwise.platforms.interface import Platform
from slotwise.platforms.spec import PlatformSpec, api_range_warning
from slotwise.plugins.manager import PluginManager, PluginRecord, get_plugin_manager
from slotwise.plugins.plugin_code import call_plugin_code, outcome, plugin_code

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "install a platform plugin: 'pip install slotwise-cpu' for the CPU, "
    "'pip install slotwise-cuda' for NVIDIA GPUs, or your accelerator vendor's package"
)


@dataclass
class PlatformEntry:
    """A platform offered by a plugin, with what resolution learned about it."""

    spec: PlatformSpec
    plugin: PluginRecord
    status: str = "unprobed"  # selected|available|unavailable|incompatible|failed|unprobed
    reason: str = ""

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class ReportRow:
    """One line of ``plugin_report()``: a platform, or a plugin that offers none."""

    kind: str  # "platform" | "plugin"
    name: str
    plugin: str
    distribution: str
    version: str
    status: str
    reason: str
    priority: int | None = None
    requires_api: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class PlatformResolver:
    """Collects platform specs from the plugins and selects one, thread-safely."""

    def __init__(self, manager: PluginManager) -> None:
        self.manager = manager
        self.entries: dict[str, PlatformEntry] = {}
        self.selection_reason = ""
        self._lock = threading.RLock()
        self._collect()

    def _collect(self) -> None:
        for record, specs in self.manager.call_each("slotwise_platforms"):
            problem = _check_specs(specs)
            if problem:
                self.manager.fail(record, f"hook slotwise_platforms returned {problem}")
                continue
            for spec in specs or ():  # None: the plugin offers no platform
                twin = self.entries.get(spec.name)
                if twin is not None:
                    self.manager.fail(
                        record,
                        f"registers platform {spec.name!r}, which {twin.plugin.label} "
                        "registers already; uninstall one of them",
                    )
                    break
                entry = PlatformEntry(spec, record)
                api_warning = api_range_warning(spec)
                if api_warning:
                    self.manager.warn(record, f"platform {spec.name!r}: {api_warning}")
                if not spec.supports_api(version.API_VERSION):
                    entry.status = "incompatible"
                    entry.reason = (
                        f"requires slotwise API {spec.requires_api}, this slotwise "
                        f"{version.__version__} provides API {version.API_VERSION}"
                    )
                self.entries[spec.name] = entry
        # Drop the platforms of a plugin failed half-way through its list.
        for name in [n for n, e in self.entries.items() if e.plugin.status == "failed"]:
            del self.entries[name]

    def probe(self, entry: PlatformEntry) -> bool:
        """Run ``entry``'s probe once; True when the platform can run here (a Ctrl-C
        leaves it unprobed, so a later resolution asks again)."""
        with self._lock:
            if entry.status == "unprobed":
                try:
                    answer = call_plugin_code(
                        entry.plugin,
                        f"probe of platform {entry.name!r}",
                        entry.spec.probe,
                        limit_s=envs.probe_timeout(),
                        variable="SLOTWISE_PROBE_TIMEOUT",
                    )
                except Exception as exc:  # noqa: BLE001 - a broken probe is a broken plugin
                    entry.status = "failed"
                    entry.reason = f"probe {outcome(exc)}"
                    self.manager.fail(entry.plugin, f"platform {entry.name!r}: {entry.reason}")
                    return False
                if answer is True:
                    entry.status = "available"
                elif answer is False or isinstance(answer, str):
                    entry.status = "unavailable"
                    entry.reason = answer or "probe returned False"
                else:
                    entry.status = "failed"
                    entry.reason = f"probe returned {answer!r}, expected True, False or a reason"
                    self.manager.fail(entry.plugin, f"platform {entry.name!r}: {entry.reason}")
            return entry.status in ("available", "selected")

    def select(self) -> PlatformEntry | None:
        """The entry to instantiate, or None when no platform is available."""
        forced = envs.get("SLOTWISE_PLATFORM")
        if forced is not None:
            entry = self._forced(forced)
            self.selection_reason = f"selected by SLOTWISE_PLATFORM={forced}"
        else:
            entry = self._by_priority()
            if entry is None:
                return None
        entry.status = "selected"
        return entry

    def _forced(self, name: str) -> PlatformEntry:
        entry = self.entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self.entries)) or "none"
            extra = self._plugin_problems()
            raise PlatformNotFoundError(
                f"SLOTWISE_PLATFORM={name}: no such platform. Known platforms: {known}."
                f"{extra} Set SLOTWISE_PLATFORM to one of the known names, or {INSTALL_HINT}."
            )
        if entry.status == "incompatible":
            raise PlatformError(
                f"SLOTWISE_PLATFORM={name}: {entry.plugin.label} {entry.reason}. "
                f"Upgrade or downgrade {entry.plugin.distribution} or slotwise so the "
                "ranges match."
            )
        if not self.probe(entry):
            raise PlatformNotFoundError(
                f"SLOTWISE_PLATFORM={name}: platform {name!r} is not available here: "
                f"{entry.reason}. Unset SLOTWISE_PLATFORM to pick the best available platform."
            )
        return entry

    def _by_priority(self) -> PlatformEntry | None:
        candidates = sorted(
            (e for e in self.entries.values() if e.status != "incompatible"),
            key=lambda e: -e.spec.priority,
        )
        winners: list[PlatformEntry] = []
        for entry in candidates:
            if winners and entry.spec.priority < winners[0].spec.priority:
                break
            if self.probe(entry):
                winners.append(entry)
        if len(winners) > 1:
            names = " and ".join(f"{e.name!r} from {e.plugin.label}" for e in winners)
            raise PlatformError(
                f"platforms {names} are both available with priority "
                f"{winners[0].spec.priority}; set SLOTWISE_PLATFORM to one of "
                f"{', '.join(e.name for e in winners)}, or uninstall one plugin"
            )
        if not winners:
            return None
        winner = winners[0]
        others = [e.name for e in candidates if e is not winner and e.status == "available"]
        self.selection_reason = f"highest priority ({winner.spec.priority}) available platform" + (
            f" (also available: {', '.join(others)})" if others else ""
        )
        return winner

    def _plugin_problems(self) -> str:
        bad = [r for r in self.manager.records.values() if r.status != "loaded"]
        if not bad:
            return ""
        return " Plugins not loaded: " + "; ".join(f"{r.name} ({r.reason})" for r in bad) + "."

    def nothing_available_message(self) -> str:
        if not self.entries:
            found = "no platform plugin is installed"
        else:
            found = "no installed platform is available: " + "; ".join(
                f"{e.name}: {e.status} ({e.reason})" for e in self.entries.values()
            )
        return (
            f"slotwise found no platform: {found}.{self._plugin_problems()} To fix, {INSTALL_HINT}."
        )

    def _reason(self, entry: PlatformEntry, forced: str | None) -> str:
        if entry.status == "selected":
            return entry.reason or self.selection_reason
        if entry.status == "unprobed" and forced is not None:
            return f"not probed: SLOTWISE_PLATFORM={forced} names the platform to use"
        return entry.reason

    def report(self) -> list[ReportRow]:
        """Every plugin and platform with its status, probing what is not probed yet
        unless SLOTWISE_PLATFORM names the platform to use."""
        forced = envs.get("SLOTWISE_PLATFORM")
        rows = []
        for entry in sorted(self.entries.values(), key=lambda e: (-e.spec.priority, e.name)):
            if entry.status == "unprobed" and forced is None:
                self.probe(entry)
            record = entry.plugin
            if record.status == "failed" and entry.status != "failed":
                # Failed after its platforms were collected: in a registration hook.
                entry.status, entry.reason = "failed", record.reason
            reason = self._reason(entry, forced)
            row = _row("platform", entry.name, record, entry.status, reason)
            row.priority, row.requires_api = entry.spec.priority, entry.spec.requires_api
            rows.append(row)
        offering = {e.plugin.name for e in self.entries.values()}
        for record in sorted(self.manager.records.values(), key=lambda r: r.name):
            if record.name not in offering:
                reason = record.reason or "offers no platform"
                rows.append(_row("plugin", record.name, record, record.status, reason))
        return rows


def _row(kind: str, name: str, record: PluginRecord, status: str, reason: str) -> ReportRow:
    return ReportRow(kind, name, record.name, record.distribution, record.version, status, reason)


def _check_specs(specs: Any) -> str:
    """Why ``specs`` is not a valid hook answer, or "" when it is."""
    if specs is None:
        return ""
    if not isinstance(specs, (list, tuple)):
        return f"{type(specs).__name__} {specs!r:.80}, expected a list of PlatformSpec"
    for item in specs:
        if not isinstance(item, PlatformSpec):
            return f"a list containing {type(item).__name__} {item!r:.80}, expected PlatformSpec"
    return ""


def instantiate(entry: PlatformEntry) -> Platform:
    """Import and construct the selected platform class; errors name the plugin."""
    with plugin_code(entry.plugin, f"instantiation of platform {entry.name!r}"):
        platform_cls = resolve_import_path(
            entry.spec.platform_cls,
            what=f"platform {entry.name!r} from {entry.plugin.label}",
            fix=f"fix or uninstall {entry.plugin.distribution}",
            expected_type=Platform,
            error=PlatformError,
        )
        platform = platform_cls()
        if platform.name != entry.name:
            raise PlatformError(
                f"platform {entry.name!r} from {entry.plugin.label}: class "
                f"{entry.spec.platform_cls!r} says its name is {platform.name!r}; they must match"
            )
        return platform


_resolver: PlatformResolver | None = None
_resolver_lock = threading.Lock()
_platform: Platform | None = None
_error: Exception | None = None
_platform_lock = threading.Lock()


def get_resolver() -> PlatformResolver:
    global _resolver
    with _resolver_lock:
        if _resolver is None:
            _resolver = PlatformResolver(get_plugin_manager())
        return _resolver


def declared_platforms() -> dict[str, tuple[str, ...]]:
    """Each plugin's name -> the platforms it declares, for the registration hooks."""
    declared: dict[str, tuple[str, ...]] = {}
    for entry in get_resolver().entries.values():
        declared[entry.plugin.name] = (*declared.get(entry.plugin.name, ()), entry.name)
    return declared


def get_current_platform() -> Platform:
    """The platform of this process, resolved once; a resolution error is raised again on
    every later call, an interrupt is not."""
    global _platform, _error
    if _platform is not None:
        return _platform
    with _platform_lock:
        if _platform is None:
            if _error is not None:
                raise _error
            try:
                envs.validate_all()
                _platform = _resolve(get_resolver())
            except Exception as exc:
                _error = exc
                raise
        return _platform


def _resolve(resolver: PlatformResolver) -> Platform:
    entry = resolver.select()
    if entry is None:
        from slotwise.platforms.unspecified import UnspecifiedPlatform

        return UnspecifiedPlatform(resolver.nothing_available_message())
    try:
        platform = instantiate(entry)
    except Exception as exc:
        # The report must not call "selected" a platform that could not be built.
        entry.status, entry.reason = "failed", str(exc)
        raise
    logger.debug("platform %s: %s", entry.name, resolver.selection_reason)
    return platform


def plugin_report() -> list[ReportRow]:
    """Every plugin and platform with its status and reason (for `slotwise env`)."""
    try:
        get_current_platform()
    except PlatformError:
        pass  # the report shows the statuses that led to the error
    return get_resolver().report()


@contextlib.contextmanager
def use_platform(platform: Platform) -> Iterator[Platform]:
    """Make ``platform`` the current platform inside the block, bypassing resolution
    (for tests and conformance kits that exercise a platform object directly)."""
    global _platform
    with _platform_lock:
        previous, _platform = _platform, platform
    try:
        yield platform
    finally:
        with _platform_lock:
            _platform = previous
