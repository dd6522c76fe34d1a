"""Which attention backends each platform offers, as registered by the plugins.

Plugins register through the ``slotwise_register_attention_backends(registry)`` hook,
also for another plugin's platform.  A backend given as a ``"module:Class"`` string
is imported only when a selection looks at it, so registering costs nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from slotwise.attention.backend import AttentionBackend

_CLASS_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass
class BackendEntry:
    """One registration: a backend offered for a platform at a priority."""

    platform: str
    backend: type[AttentionBackend] | str
    priority: int
    #: Registration order; breaks priority ties so selection is deterministic.
    order: int
    _loaded: type[AttentionBackend] | None = field(default=None, repr=False)
    _error: Exception | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        if isinstance(self.backend, str):
            return self.backend
        return f"{self.backend.__module__}:{self.backend.__qualname__}"

    def load(self) -> type[AttentionBackend]:
        """The backend class, imported on first use; a failure is remembered and re-raised."""
        if self._error is not None:
            raise self._error
        if self._loaded is None:
            try:
                self._loaded = _resolve(self.backend)
            except Exception as exc:
                self._error = exc
                raise
        return self._loaded


class AttentionBackendRegistry:
    """The object passed to ``slotwise_register_attention_backends``."""

    def __init__(self) -> None:
        self._entries: list[BackendEntry] = []
        self._order = itertools.count()

    def register(
        self, platform_name: str, backend: type[AttentionBackend] | str, priority: int = 0
    ) -> None:
        """Offer ``backend`` on ``platform_name``; higher ``priority`` is tried first."""
        if isinstance(backend, str):
            if not _CLASS_PATH.match(backend):
                raise ValueError(
                    f"attention backend {backend!r} must be a 'module:Class' string, "
                    "e.g. 'slotwise_myvendor.attention:MyBackend', or the class itself"
                )
        elif not (isinstance(backend, type) and issubclass(backend, AttentionBackend)):
            raise TypeError(
                f"attention backend {backend!r} must be an AttentionBackend subclass "
                "or a 'module:Class' string"
            )
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority of {backend!r} must be an int, got {priority!r}")
        self._entries.append(BackendEntry(platform_name, backend, priority, next(self._order)))

    def merge(self, other: AttentionBackendRegistry) -> None:
        """Take ``other``'s registrations (one plugin's), after the ones already here."""
        for entry in other._entries:
            self._entries.append(dataclasses.replace(entry, order=next(self._order)))

    def entries(self, platform_name: str | None = None) -> list[BackendEntry]:
        """Registrations for ``platform_name`` (all when None), highest priority first."""
        chosen = [e for e in self._entries if platform_name in (None, e.platform)]
        return sorted(chosen, key=lambda e: (-e.priority, e.order))


def _resolve(backend: type[AttentionBackend] | str) -> type[AttentionBackend]:
    obj: Any = backend
    if isinstance(backend, str):
        module_name, _, qualname = backend.partition(":")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, AttentionBackend)):
        raise TypeError(f"{obj!r} is not a subclass of slotwise.attention.AttentionBackend")
    return obj


_registry: AttentionBackendRegistry | None = None
_registry_lock = threading.Lock()


def get_attention_backend_registry() -> AttentionBackendRegistry:
    """The process-wide registry; the plugins' hooks run on the first call only."""
    global _registry
    with _registry_lock:
        if _registry is None:
            from slotwise.plugins import get_plugin_manager

            # Each plugin registers into a registry of its own, kept only if its hook
            # succeeds: a plugin failing half-way leaves no backend behind.
            registry = AttentionBackendRegistry()
            manager = get_plugin_manager()
            for _, staged in manager.register_each(
                "slotwise_register_attention_backends", AttentionBackendRegistry
            ):
                registry.merge(staged)
            _registry = registry
        return _registry
