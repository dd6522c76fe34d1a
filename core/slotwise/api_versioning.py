"""Renames in the plugin API, so plugins written against an older minor version keep working.

``slotwise.API_VERSION`` is ``MAJOR.MINOR``: a minor bump only adds, a major bump may
remove (docs/api-versioning.md is the policy).  Renaming a hook or a ``Platform``
method is an addition of the new name plus a deprecation of the old one: the old name
goes into a table below and keeps working, with a warning, until the next major
version removes it.  The plugin manager reads ``RENAMED_HOOKS`` when it registers a
plugin, ``Platform.__init_subclass__`` reads ``RENAMED_PLATFORM_METHODS`` when a
platform class is defined.  A reordering of a method's arguments is deprecated the
same way (``REORDERED_ARGUMENTS``, read by the method itself).

This module is plain data with no imports, because both readers run during
``import slotwise`` / platform resolution, which must stay cheap.
"""

from __future__ import annotations

#: Old hook name -> (new hook name, API version that deprecated the old one).
#: An implementation under the old name is registered under the new one.
RENAMED_HOOKS: dict[str, tuple[str, str]] = {}

#: Old ``Platform`` method name -> (new method name, API version that deprecated the
#: old one).  A subclass defining the old method gets it under the new name too.
RENAMED_PLATFORM_METHODS: dict[str, tuple[str, str]] = {}

#: ``Class.method`` -> (old argument order, new argument order, API version that
#: deprecated the old one).  A call in the old order is recognised only where it can
#: mean nothing valid in the new one; it is then answered as before, with a
#: ``DeprecationWarning``.
REORDERED_ARGUMENTS: dict[str, tuple[str, str, str]] = {
    "CustomOpRegistry.register": (
        "op_name, platform, implementation",
        "platform_name, op_name, implementation, priority=0",
        "1.5",
    ),
}


def removal_version(deprecated_in: str) -> str:
    """The API version whose release may drop a name deprecated in ``deprecated_in``.

    Deprecated names live for the rest of their major version: "1.3" -> "2.0".
    """
    major = int(deprecated_in.split(".", 1)[0])
    return f"{major + 1}.0"
