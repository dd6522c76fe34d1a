"""Which attention backends each platform offers, as registered by the plugins.

Plugins register through the ``slotwise_register_attention_backends(registry)`` hook,
also for another plugin's platform.  A backend given as a ``"module:Class"`` string
is imported only when a selection looks at it, so registering costs nothing.  The
rules (argument order, priority, failures, errors) are every registry's
(``slotwise.platforms.registries``).
"""

from __future__ import annotations

from slotwise.attention.backend import AttentionBackend
from slotwise.platforms.registries import (
    PluginRegistry,
    Registration,
    RegistryError,
    filled_registry,
)


class AttentionBackendError(RegistryError):
    """No attention backend can serve a layer, or the one asked for cannot."""


class UnknownAttentionBackendError(RegistryError):
    """``SLOTWISE_ATTENTION_BACKEND`` (or ``selected``) names no backend of the platform.

    Not an :class:`AttentionBackendError`: the name is at fault, not the layer, so
    callers that answer a layer's misfit (another dtype, another block size) let it
    through; the message lists the names that exist.
    """


#: One registration of an attention backend (the backend is its ``target``).
BackendEntry = Registration


class AttentionBackendRegistry(PluginRegistry):
    """The object passed to ``slotwise_register_attention_backends``: for each platform,
    the backends selection tries, the highest priority first."""

    _error_type = AttentionBackendError
    _call = "registry.register(platform_name, backend, priority=0)"

    def register(
        self, platform_name: str, backend: type[AttentionBackend] | str, priority: int = 0
    ) -> None:
        """Offer ``backend`` on ``platform_name``; higher ``priority`` is tried first."""
        if not isinstance(backend, str) and not (
            isinstance(backend, type) and issubclass(backend, AttentionBackend)
        ):
            raise AttentionBackendError(
                f"attention backend {backend!r} for platform {platform_name!r} must be an "
                "AttentionBackend subclass or a 'module:Class' string; "
                f"call {self._call}"
            )
        self._add(
            platform_name,
            backend,
            priority,
            what="attention backend",
            example="slotwise_myvendor.attention:MyBackend",
            expected_type=AttentionBackend,
        )

    def register_own(self, backend: type[AttentionBackend] | str, priority: int = 0) -> None:
        """Offer ``backend`` on the platform this plugin declares in ``slotwise_platforms``.

        The registry knows that name, so the plugin writes it once, in its spec.
        """
        self.register(self._own_platform(), backend, priority)

    def registrations(self) -> list[tuple[str, str]]:
        return [(r.platform, f"attention backend {r.label}") for r in self._registrations]

    def entries(self, platform_name: str | None = None) -> list[BackendEntry]:
        """Registrations for ``platform_name`` (all when None), highest priority first."""
        return self._ranked(platform_name)


def get_attention_backend_registry() -> AttentionBackendRegistry:
    """The process-wide registry; the plugins' hooks run on the first call only."""
    return filled_registry("slotwise_register_attention_backends", AttentionBackendRegistry)
