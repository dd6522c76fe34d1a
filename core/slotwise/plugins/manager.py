"""Loading plugins from entry points, one at a time, so one broken plugin cannot take
the others down (pluggy's ``load_setuptools_entrypoints`` stops at the first failure).
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, TypeVar

import pluggy

from slotwise import api_versioning, envs
from slotwise.errors import SlotwiseError
from slotwise.plugins import hookspecs
from slotwise.plugins.entry_point_loading import load_entry_point
from slotwise.plugins.markers import ENTRY_POINT_GROUP, PROJECT_NAME
from slotwise.plugins.plugin_code import PluginCodeError, call_plugin_code, describe, outcome

# The command-line modules import the stdout guard from here.
from slotwise.plugins.plugin_code import stdout_to_stderr as stdout_to_stderr

logger = logging.getLogger(__name__)


class Registry(Protocol):
    """What a registration hook fills, built with the platforms the registering plugin
    declares, so its ``register_own`` needs no platform name."""

    def merge(self, other: Any, source: str) -> None:
        """Take ``other``'s registrations, made by plugin ``source`` (its label)."""

    def registrations(self) -> list[tuple[str, str]]:
        """``(platform name, what is registered for it)`` for each registration."""
        ...


R = TypeVar("R", bound=Registry)


class PluginError(SlotwiseError, RuntimeError):
    """A plugin is broken and SLOTWISE_STRICT_PLUGINS=1 asks for an error."""


@dataclass
class PluginRecord:
    """What slotwise knows about one entry point, for reports and error messages."""

    name: str
    value: str
    dist: importlib.metadata.Distribution | None = field(default=None, repr=False)
    status: str = "loaded"  # "loaded" | "failed" | "filtered"
    reason: str = ""
    #: What was warned about this plugin while it stayed loaded (conformance fails on it).
    warnings: list[str] = field(default_factory=list)

    # Read lazily: parsing METADATA costs more than the rest of discovery.
    @cached_property
    def distribution(self) -> str:
        return self.dist.name if self.dist else "<unknown>"

    @cached_property
    def version(self) -> str:
        return self.dist.version if self.dist else "?"

    @property
    def label(self) -> str:
        return f"plugin {self.name!r} (distribution {self.distribution} {self.version})"


class _RenameAwarePluggyManager(pluggy.PluginManager):
    """pluggy's manager, registering an implementation of a renamed hook under its new name
    (through ``specname``, so pluggy checks and calls it as the new hook)."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> pluggy.HookimplOpts | None:
        opts = super().parse_hookimpl_opts(plugin, name)
        rename = api_versioning.RENAMED_HOOKS.get(name)
        if opts is None or rename is None or opts.get("specname"):
            return opts
        if self.implements(plugin, rename[0]):
            return None  # the plugin has the new name too: that one is the implementation
        return {**opts, "specname": rename[0]}

    def implements(self, plugin: Any, name: str) -> bool:
        """Whether ``plugin`` has an attribute ``name`` marked as a hook implementation."""
        return super().parse_hookimpl_opts(plugin, name) is not None


class PluginManager:
    """The plugins of one process: loaded once, each hook called per plugin."""

    def __init__(self, *, strict: bool | None = None, allow: list[str] | None = None):
        self.strict = envs.flag("SLOTWISE_STRICT_PLUGINS") if strict is None else strict
        self.allow = envs.name_list("SLOTWISE_PLUGINS") if allow is None else allow
        self._pm = _RenameAwarePluggyManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self._warned: set[tuple[str, str]] = set()

    def load_entry_points(self) -> None:
        """Load every plugin of the group, read from the installation by this process."""
        entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        limit_s = envs.plugin_timeout()
        for ep in sorted(entry_points, key=lambda ep: ep.name):
            first = self.records.get(ep.name)
            if first is not None:
                # Two distributions declaring one plugin name: the first listed wins.
                self.warn(first, _same_name_message(ep))
                continue
            record = PluginRecord(name=ep.name, value=ep.value, dist=ep.dist)
            self.records[ep.name] = record
            if self.allow is not None and ep.name not in self.allow:
                record.status = "filtered"
                record.reason = (
                    "not in SLOTWISE_PLUGINS=" + ",".join(self.allow)
                    if self.allow
                    else "SLOTWISE_PLUGINS is set but empty, which loads no plugin"
                )
                continue
            try:
                plugin = call_plugin_code(
                    record,
                    f"import of {ep.value!r}",
                    functools.partial(load_entry_point, ep),
                    limit_s=limit_s,
                    variable="SLOTWISE_PLUGIN_TIMEOUT",
                )
                self._pm.register(plugin, name=ep.name)
            except PluginCodeError as exc:
                self.fail(record, f"failed to load {ep.value!r}: its import {exc.phrase}")
                continue
            except Exception as exc:  # noqa: BLE001 - isolation is the point
                self.fail(record, f"failed to load {ep.value!r}: {describe(exc)}")
                continue
            unknown = [
                caller.name
                for caller in self._pm.get_hookcallers(plugin) or []
                if not caller.has_spec()
            ]
            if unknown:
                self._pm.unregister(plugin)
                self.fail(record, _unknown_hooks_message(unknown))
                continue
            wrappers = _wrapper_hooks(self._pm, plugin)
            if wrappers:
                self.fail(record, _wrapper_hooks_message(wrappers))
                continue
            self._warn_renamed_hooks(record, plugin)
            self._warn_unmarked_hooks(record, plugin)
        if self.allow is not None:
            missing = sorted(set(self.allow) - set(self.records))
            if missing:
                logger.warning(
                    "SLOTWISE_PLUGINS names %s, but no such plugin is installed; installed: %s",
                    ", ".join(missing),
                    ", ".join(sorted(self.records)) or "none",
                )

    def _warn_renamed_hooks(self, record: PluginRecord, plugin: Any) -> None:
        """One deprecation warning per renamed hook that ``plugin`` implements by its old name."""
        for old, (new, deprecated_in) in api_versioning.RENAMED_HOOKS.items():
            if not self._pm.implements(plugin, old):
                continue
            if self._pm.implements(plugin, new):
                logger.warning(
                    "%s implements hook %s and its new name %s (renamed in slotwise API %s); "
                    "%s is ignored, remove it",
                    record.label,
                    old,
                    new,
                    deprecated_in,
                    old,
                )
            else:
                logger.warning(
                    "%s implements hook %s, deprecated in slotwise API %s: rename it to %s "
                    "(the old name stops working in API %s)",
                    record.label,
                    old,
                    deprecated_in,
                    new,
                    api_versioning.removal_version(deprecated_in),
                )

    def _warn_unmarked_hooks(self, record: PluginRecord, plugin: Any) -> None:
        """One warning per function named like a hook but not marked ``@hookimpl``, which
        pluggy (unlike pytest's name-based discovery) never calls."""
        for name, hook in _unmarked_hooks(plugin, self._pm.implements):
            new_name = api_versioning.RENAMED_HOOKS.get(hook, (None,))[0]
            renamed = f" (renamed to {new_name})" if new_name else ""
            rename = "" if name == hook else f" and name it {hook}"
            self.warn(
                record,
                f"defines {name}(), which looks like hook {hook}{renamed} but is not marked "
                f"@hookimpl, so slotwise never calls it; did you forget @hookimpl? "
                f"Add 'from slotwise.plugin_api import hookimpl' and decorate {name}() "
                f"with @hookimpl{rename}",
            )

    def warn(self, record: PluginRecord, problem: str) -> None:
        """Warn once about ``problem`` with ``record``'s plugin, which stays loaded."""
        if (record.name, problem) in self._warned:
            return
        self._warned.add((record.name, problem))
        record.warnings.append(problem)
        logger.warning("%s %s", record.label, problem)

    def call_each(self, hook_name: str, **kwargs: Any) -> list[tuple[PluginRecord, Any]]:
        """Call ``hook_name`` on every loaded plugin; a plugin whose hook raises is failed."""
        return self._call_each(hook_name, lambda record: kwargs)

    def register_all(
        self,
        hook_name: str,
        new_registry: Callable[..., R],
        declared: Mapping[str, tuple[str, ...]],
    ) -> R:
        """One registry filled through the registration hook ``hook_name`` of every plugin.

        Each plugin fills a fresh registry knowing its ``declared`` platforms, merged only
        when its hook returns, so one failing half-way leaves nothing behind.
        """
        staged: dict[str, R] = {}

        def fresh(record: PluginRecord) -> dict[str, Any]:
            staged[record.name] = new_registry(declared.get(record.name, ()))
            return {"registry": staged[record.name]}

        known = sorted({name for names in declared.values() for name in names})
        registry = new_registry()
        for record, _ in self._call_each(hook_name, fresh):
            for platform, what in staged[record.name].registrations():
                if platform not in known:
                    self.warn(record, _undeclared_platform_message(platform, what, known))
            registry.merge(staged[record.name], record.label)
        return registry

    def _call_each(
        self, hook_name: str, kwargs_for: Callable[[PluginRecord], dict[str, Any]]
    ) -> list[tuple[PluginRecord, Any]]:
        results = []
        limit_s = envs.plugin_timeout()
        caller = getattr(self._pm.hook, hook_name)
        # pluggy's own calling order: tryfirst, then the latest registered, then trylast.
        # Wrappers never get here: registration refuses them (see _wrapper_hooks).
        for impl in reversed(caller.get_hookimpls()):
            record = self.records[impl.plugin_name]
            if record.status != "loaded":
                continue
            given = kwargs_for(record)
            arguments = {arg: given[arg] for arg in impl.argnames}
            try:
                result = call_plugin_code(
                    record,
                    f"hook {hook_name}",
                    functools.partial(impl.function, **arguments),
                    limit_s=limit_s,
                    variable="SLOTWISE_PLUGIN_TIMEOUT",
                )
            except Exception as exc:  # noqa: BLE001 - isolation is the point
                self.fail(record, f"hook {hook_name} {outcome(exc)}")
                continue
            results.append((record, result))
        return results

    def fail(self, record: PluginRecord, reason: str) -> None:
        """Mark a plugin failed: an error in strict mode, else one warning."""
        record.status = "failed"
        record.reason = reason
        plugin = self._pm.get_plugin(record.name)
        if plugin is not None:
            self._pm.unregister(plugin)
        message = f"{record.label} {reason}"
        if self.strict:
            raise PluginError(message + " (SLOTWISE_STRICT_PLUGINS=1 makes this an error)")
        logger.warning(
            "%s; skipped. Fix or uninstall it; SLOTWISE_STRICT_PLUGINS=1 makes this an error.",
            message,
        )


def _known_hooks() -> list[str]:
    return sorted(n for n in dir(hookspecs) if n.startswith("slotwise_"))


def _unmarked_hooks(plugin: Any, implements: Callable[[Any, str], bool]) -> list[tuple[str, str]]:
    """``(function name, hook it looks like)`` for each public function of ``plugin``
    named like a hook (exactly, by an old name, or a near miss) but not marked."""
    known = _known_hooks()
    candidates = known + sorted(api_versioning.RENAMED_HOOKS)
    found = []
    for name in sorted(vars(plugin) if inspect.ismodule(plugin) else dir(plugin)):
        if name.startswith("_") or implements(plugin, name):
            continue
        try:
            value = getattr(plugin, name)
        except Exception:  # noqa: BLE001 - a broken attribute is not a hook
            continue
        if not inspect.isroutine(value):
            continue
        if inspect.ismodule(plugin) and _package(value) != _package(plugin):
            continue  # imported from another package: not the plugin's own code
        if name in candidates:
            found.append((name, name))
            continue
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.8)
        if close:
            found.append((name, close[0]))
    return found


def _wrapper_hooks(pm: pluggy.PluginManager, plugin: Any) -> list[str]:
    """The hooks ``plugin`` implements as wrappers, which do nothing when each plugin's
    hook is called on its own."""
    return sorted(
        caller.name
        for caller in pm.get_hookcallers(plugin) or []
        for impl in caller.get_hookimpls()
        if impl.plugin is plugin and (impl.wrapper or impl.hookwrapper)
    )


def _wrapper_hooks_message(hooks: list[str]) -> str:
    return (
        f"implements {', '.join(hooks)} as a hook wrapper (wrapper=True or hookwrapper=True), "
        "which slotwise does not support: it calls each plugin's hook on its own. Use a "
        "plain @hookimpl (tryfirst=True and trylast=True order it among the others)"
    )


def _package(obj: Any) -> str:
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    return (module or "").partition(".")[0]


def _same_name_message(ep: importlib.metadata.EntryPoint) -> str:
    other = PluginRecord(name=ep.name, value=ep.value, dist=ep.dist)
    return (
        f"shares its name with the plugin of distribution {other.distribution} "
        f"{other.version} ({ep.value!r}), which slotwise therefore does not load; uninstall "
        "one of the two distributions, or rename one's entry point"
    )


def _undeclared_platform_message(platform: str, what: str, known: list[str]) -> str:
    close = difflib.get_close_matches(platform, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"registers {what} for platform {platform!r}, which no installed plugin declares, "
        f"so it is never used; {hint}Declared platforms: {', '.join(known) or 'none'}. "
        "For your own platform, registry.register_own(...) needs no name"
    )


def _unknown_hooks_message(names: list[str]) -> str:
    known = _known_hooks()
    parts = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        parts.append(f"{name}{hint}")
    return f"implements unknown hooks {', '.join(parts)}; known hooks: {', '.join(known)}"


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, entry points loaded on first call."""
    global _manager
    with _manager_lock:
        if _manager is None:
            manager = PluginManager()
            manager.load_entry_points()
            _manager = manager
        return _manager
