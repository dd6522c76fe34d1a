"""pluggy markers for the ``slotwise`` project name."""

from __future__ import annotations

import pluggy

PROJECT_NAME = "slotwise"
ENTRY_POINT_GROUP = "slotwise.plugins"

#: Marks a function in ``hookspecs.py`` as a hook specification.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marks a plugin's function as an implementation of a slotwise hook.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
