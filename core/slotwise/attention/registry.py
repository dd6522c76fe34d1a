"""Which attention backends each platform offers, as registered by the plugins.

Plugins register through the ``slotwise_register_attention_backends(registry)`` hook,
also for another plugin's platform.  A backend given as a ``"module:Class"`` string
is imported only when a selection looks at it, so registering costs nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from slotwise.attention.backend import AttentionBackend
from slotwise.errors import SlotwiseError
from slotwise.import_path import check_import_path, resolve_import_path
from slotwise.platforms.registries import filled_registry
from slotwise.plugins.registration import own_platform


class AttentionBackendError(SlotwiseError, ValueError):
    """No attention backend can serve a layer, or the one asked for cannot."""


@dataclass
class BackendEntry:
    """One registration: a backend offered for a platform at a priority."""

    platform: str
    backend: type[AttentionBackend] | str
    priority: int
    #: Registration order; breaks priority ties so selection is deterministic.
    order: int
    #: The plugin that registered it, for error messages; "" when registered directly.
    source: str = ""
    _loaded: type[AttentionBackend] | None = field(default=None, repr=False)
    _error: AttentionBackendError | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        if isinstance(self.backend, str):
            return self.backend
        return f"{self.backend.__module__}:{self.backend.__qualname__}"

    def load(self) -> type[AttentionBackend]:
        """The backend class, imported on first use; a failure is remembered and re-raised."""
        if not isinstance(self.backend, str):
            return self.backend  # register() checked the class
        if self._error is not None:
            raise self._error
        if self._loaded is None:
            try:
                self._loaded = resolve_import_path(
                    self.backend,
                    what=f"attention backend for platform {self.platform!r}"
                    + (f" from {self.source}" if self.source else ""),
                    fix="fix or uninstall the plugin that registers it",
                    expected_type=AttentionBackend,
                    error=AttentionBackendError,
                )
            except AttentionBackendError as exc:
                self._error = exc
                raise
        return self._loaded


class AttentionBackendRegistry:
    """The object passed to ``slotwise_register_attention_backends``."""

    def __init__(self, own_platforms: tuple[str, ...] = ()) -> None:
        self._entries: list[BackendEntry] = []
        self._order = itertools.count()
        #: The platforms the registering plugin declares, for ``register_own``.
        self.own_platforms = own_platforms

    def register(
        self, platform_name: str, backend: type[AttentionBackend] | str, priority: int = 0
    ) -> None:
        """Offer ``backend`` on ``platform_name``; higher ``priority`` is tried first."""
        if isinstance(backend, str):
            check_import_path(
                backend,
                f"attention backend for platform {platform_name!r}",
                fix="give a 'module:Class' string such as 'slotwise_myvendor.attention:MyBackend'"
                ", or the class itself",
            )
        elif not (isinstance(backend, type) and issubclass(backend, AttentionBackend)):
            raise TypeError(
                f"attention backend {backend!r} must be an AttentionBackend subclass "
                "or a 'module:Class' string"
            )
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority of {backend!r} must be an int, got {priority!r}")
        self._entries.append(BackendEntry(platform_name, backend, priority, next(self._order)))

    def register_own(self, backend: type[AttentionBackend] | str, priority: int = 0) -> None:
        """Offer ``backend`` on the platform this plugin declares in ``slotwise_platforms``.

        The registry knows that name, so the plugin writes it once, in its spec.
        """
        self.register(
            own_platform(self.own_platforms, "register_own", AttentionBackendError),
            backend,
            priority,
        )

    def registrations(self) -> list[tuple[str, str]]:
        return [(e.platform, f"attention backend {e.label}") for e in self._entries]

    def merge(self, other: AttentionBackendRegistry, source: str) -> None:
        """Take ``other``'s registrations (plugin ``source``'s), after the ones already here."""
        for entry in other._entries:
            self._entries.append(dataclasses.replace(entry, order=next(self._order), source=source))

    def entries(self, platform_name: str | None = None) -> list[BackendEntry]:
        """Registrations for ``platform_name`` (all when None), highest priority first."""
        chosen = [e for e in self._entries if platform_name in (None, e.platform)]
        return sorted(chosen, key=lambda e: (-e.priority, e.order))


def get_attention_backend_registry() -> AttentionBackendRegistry:
    """The process-wide registry; the plugins' hooks run on the first call only."""
    return filled_registry("slotwise_register_attention_backends", AttentionBackendRegistry)
