"""The slotwise hook specifications: everything a plugin can implement.

A plugin is any module or object registered under the ``slotwise.plugins``
entry-point group, e.g. in the plugin's pyproject.toml::

    [project.entry-points."slotwise.plugins"]
    myvendor = "slotwise_myvendor.plugin"

and implements some of the hooks below, marked with ``hookimpl``.  Everything a
plugin imports comes from ``slotwise.plugin_api``::

    from slotwise.plugin_api import PlatformSpec, hookimpl

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("myvendor", "slotwise_myvendor.platform:MyPlatform",
                             probe=lambda: True, priority=200, requires_api=">=1.1,<2")]

Every hook is optional.  Hooks are called once per process, the first time
slotwise needs their answer; plugins must not do heavy work (import torch,
initialise a device) inside them.  Each call (and the plugin's import) runs in a
thread of its own and may take at most SLOTWISE_PLUGIN_TIMEOUT seconds, after which
the plugin is skipped (docs/plugin-authors.md, "What slotwise guards against").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotwise.plugins.markers import hookspec

if TYPE_CHECKING:  # names only: hook specs are read before any of these is imported
    from slotwise.attention.registry import AttentionBackendRegistry
    from slotwise.custom_op import CustomOpRegistry
    from slotwise.platforms.spec import PlatformSpec


@hookspec
def slotwise_platforms() -> list[PlatformSpec]:
    """Return the platforms this plugin provides.

    Each ``PlatformSpec`` names the platform, a ``"module:Class"`` string that is
    imported only if the platform is selected, a cheap ``probe`` callable, a
    priority (bundled plugins 0-199: cpu 0, cuda 100, ascend_stub 150; vendor
    accelerators 200 and up) and the range of ``slotwise.API_VERSION`` it was written for.
    ``None`` or ``[]``: the plugin offers no platform.
    """


@hookspec
def slotwise_register_attention_backends(registry: AttentionBackendRegistry) -> None:
    """Add attention backends to ``registry``: for the platform this plugin declares,
    ``registry.register_own("my_plugin.attention:MyBackend", priority=10)``; for another
    plugin's platform, ``registry.register("cuda", "my_plugin.attention:MyBackend")``.
    A ``"module:Class"`` string is imported only when the backend is selected.  A
    registration for a platform no installed plugin declares is warned about.

    A flash-attention package, for instance, adds its backend to the ``cuda``
    platform without the CUDA plugin knowing about it.
    """


@hookspec
def slotwise_register_custom_ops(registry: CustomOpRegistry) -> None:
    """Register out-of-tree implementations of ``CustomOp`` subclasses:
    ``registry.register_own("rms_norm", "my_plugin.ops:rms_norm")`` on the platform this
    plugin declares (``registry.register("cuda", "rms_norm", ...)`` on another's), where
    the function takes the op module first and then the op's forward arguments.  Of
    several replacements of one op the highest ``priority=`` wins.

    Lets a plugin replace, e.g., RMSNorm on its platform without any change to
    model code.
    """
