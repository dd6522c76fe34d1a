"""The registries the plugins fill through registration hooks: one per hook, per process.

Attention backends and custom ops are registered the same way, so they are filled the
same way: on first use, by every plugin's hook, each registering plugin handed the
platforms it declares (data from the platform resolver, so the registries themselves
know nothing of plugins or resolution).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from slotwise.platforms.resolution import declared_platforms
from slotwise.plugins import get_plugin_manager
from slotwise.plugins.manager import R

_filled: dict[str, object] = {}
_lock = threading.Lock()


def filled_registry(hook_name: str, new_registry: Callable[..., R]) -> R:
    """The process's registry of ``hook_name``, built by ``new_registry`` and filled by
    the plugins' hooks on the first call; later calls return the same object."""
    with _lock:
        if hook_name not in _filled:
            _filled[hook_name] = get_plugin_manager().register_all(
                hook_name, new_registry, declared_platforms()
            )
        return _filled[hook_name]  # type: ignore[return-value]
