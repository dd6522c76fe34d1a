"""Plugin discovery: pluggy markers, hook specs and the per-plugin-isolated loader."""

from slotwise.plugins.manager import PluginError, PluginManager, PluginRecord, get_plugin_manager
from slotwise.plugins.markers import ENTRY_POINT_GROUP, hookimpl, hookspec

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginError",
    "PluginManager",
    "PluginRecord",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
]
