"""The registries the plugins fill through registration hooks: one per hook, per process.

Attention backends and custom-op replacements are registered the same way, so they
follow one set of rules, kept here:

- ``register(platform_name, <what>..., priority=0)``: the platform first, ``priority``
  last; ``register_own(<what>..., priority=0)`` for the plugin's own platform;
- of several registrations for one place, the highest ``priority`` wins; at equal
  priority the earlier registration does;
- a ``"module:attr"`` string is imported on first use, and a failed import is
  remembered and raised again, never retried;
- every error is the registry's ``RegistryError`` subclass, naming what was
  registered, by which plugin, and the fix.

They are filled on first use, by every plugin's hook, each registering plugin handed
the platforms it declares (data from the platform resolver, so the registries
themselves know nothing of plugins or resolution).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from slotwise.errors import SlotwiseError
from slotwise.import_path import check_import_path, resolve_import_path
from slotwise.platforms.resolution import declared_platforms
from slotwise.plugins import get_plugin_manager
from slotwise.plugins.manager import R
from slotwise.plugins.registration import own_platform

_filled: dict[str, object] = {}
_lock = threading.Lock()


class RegistryError(SlotwiseError, ValueError):
    """What the plugins registered cannot be used: a registration malformed when made,
    one naming code that fails to import when first used, or none that fits where one
    is needed.  Each registry raises its own subclass (``AttentionBackendError``,
    ``CustomOpError``)."""


@dataclass
class Registration:
    """One registration: ``target`` offered on ``platform`` at ``priority``.

    ``target`` is the object itself or a ``"module:attr"`` string that ``load()`` imports.
    """

    platform: str
    target: Any
    priority: int
    #: Registration order; at equal priority the earlier registration wins.
    order: int
    #: What is registered, for messages ("attention backend").
    what: str
    #: The name it is registered under where the registry keys on one (a custom op's
    #: ``op_name``); "" where the target names itself (an attention backend).
    name: str = ""
    #: The plugin that registered it, for error messages; "" when registered directly.
    source: str = ""
    expected_type: type | None = field(default=None, repr=False)
    error: type[RegistryError] = field(default=RegistryError, repr=False)
    _loaded: Any = field(default=None, repr=False)
    _failure: RegistryError | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        """The ``"module:attr"`` path of the target, as given or as defined."""
        if isinstance(self.target, str):
            return self.target
        qualname = getattr(self.target, "__qualname__", None)
        return f"{self.target.__module__}:{qualname}" if qualname else repr(self.target)

    def load(self) -> Any:
        """The target, imported on first use; a failure is remembered and raised again."""
        if not isinstance(self.target, str):
            return self.target  # register() checked the object
        if self._failure is not None:
            raise self._failure
        if self._loaded is None:
            what = f"{self.what} for platform {self.platform!r}" + (
                f" from {self.source}" if self.source else ""
            )
            fix = "fix or uninstall the plugin that registers it"
            try:
                found = resolve_import_path(
                    self.target,
                    what=what,
                    fix=fix,
                    expected_type=self.expected_type,
                    error=self.error,
                )
                if not callable(found):
                    raise self.error(f"{what}: {self.target!r} is {found!r}, not callable; {fix}")
            except RegistryError as exc:
                self._failure = exc
                raise
            self._loaded = found
        return self._loaded


class PluginRegistry:
    """What the objects passed to the registration hooks share (the rules above)."""

    #: The error this registry raises, a ``RegistryError`` subclass.
    _error_type: ClassVar[type[RegistryError]] = RegistryError
    #: How ``register`` is called, for error messages.
    _call: ClassVar[str] = "registry.register(platform_name, ..., priority=0)"

    def __init__(self, own_platforms: tuple[str, ...] = ()) -> None:
        self._registrations: list[Registration] = []
        self._order = itertools.count()
        #: The platforms the registering plugin declares, for ``register_own``.
        self.own_platforms = own_platforms

    def merge(self, other: PluginRegistry, source: str) -> None:
        """Take ``other``'s registrations (plugin ``source``'s), after the ones already here."""
        for registration in other._registrations:
            self._registrations.append(
                dataclasses.replace(registration, order=next(self._order), source=source)
            )

    def _add(
        self,
        platform_name: object,
        target: object,
        priority: object,
        *,
        what: str,
        example: str,
        name: str = "",
        expected_type: type | None = None,
    ) -> Registration:
        """Check one registration against the shared rules and keep it."""
        if not isinstance(platform_name, str) or not platform_name:
            raise self._error_type(
                f"{what}: the platform name must be a non-empty str, got {platform_name!r}; "
                f"call {self._call}"
            )
        where = f"{what} for platform {platform_name!r}"
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise self._error_type(
                f"{where}: priority must be an int (the highest wins), got {priority!r}; "
                f"call {self._call}"
            )
        if isinstance(target, str):
            check_import_path(
                target,
                where,
                fix=f"give a 'module:attr' string such as {example!r}, or the object itself",
                error=self._error_type,
            )
        registration = Registration(
            platform_name,
            target,
            priority,
            next(self._order),
            what,
            name=name,
            expected_type=expected_type,
            error=self._error_type,
        )
        self._registrations.append(registration)
        return registration

    def _own_platform(self) -> str:
        return own_platform(self.own_platforms, "register_own", self._error_type)

    def _ranked(
        self, platform_name: str | None = None, name: str | None = None
    ) -> list[Registration]:
        """Registrations for ``platform_name`` (all when None), the winner first."""
        chosen = [
            r
            for r in self._registrations
            if platform_name in (None, r.platform) and name in (None, r.name)
        ]
        return sorted(chosen, key=lambda r: (-r.priority, r.order))


def filled_registry(hook_name: str, new_registry: Callable[..., R]) -> R:
    """The process's registry of ``hook_name``, built by ``new_registry`` and filled by
    the plugins' hooks on the first call; later calls return the same object."""
    with _lock:
        if hook_name not in _filled:
            _filled[hook_name] = get_plugin_manager().register_all(
                hook_name, new_registry, declared_platforms()
            )
        return _filled[hook_name]  # type: ignore[return-value]
