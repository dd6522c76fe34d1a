"""slotwise's release and plugin-API versions, importable from every layer of the core."""

from __future__ import annotations

__version__ = "0.1.0"

#: Version of the plugin API (``slotwise.plugin_api``). Plugins declare the range they
#: support in ``PlatformSpec.requires_api``; see docs/api-versioning.md for the policy.
API_VERSION = "1.7"
