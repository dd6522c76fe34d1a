"""Check ``loading``: the plugin declaring the platform loads without a warning or an error.

At run time slotwise isolates a broken plugin, so an engine keeps serving: a hook that
raises is skipped with one warning, and everything that hook registered is dropped
with it (a registration hook that fails half-way leaves nothing behind).  A vendor's
CI must not pass such a plugin, so this check loads it strictly: it builds every
registry, as a model does, and fails on any problem recorded against the plugin: a
hook that raised, a registration for a platform no plugin declares (a misspelt
name), a hook-named function without ``@hookimpl``, an unbounded ``requires_api``.
"""

from __future__ import annotations

from slotwise.attention.registry import get_attention_backend_registry
from slotwise.custom_op import get_custom_op_registry
from slotwise.platforms.resolution import get_resolver
from slotwise.plugins.manager import PluginError
from slotwise.testing.conformance import target


def test_the_plugin_loads_without_warnings_or_errors() -> None:
    target.platform()
    plugin = get_resolver().entries[target.platform_name()].plugin
    problems = []
    for build in (get_attention_backend_registry, get_custom_op_registry):
        try:
            build()
        except PluginError as exc:  # SLOTWISE_STRICT_PLUGINS=1 raises at the first problem
            problems.append(str(exc))
    if plugin.status == "failed" and plugin.reason not in "".join(problems):
        problems.append(f"{plugin.reason}; slotwise skipped the plugin's other hooks")
    problems += plugin.warnings
    if problems:
        target.fail(
            f"{plugin.label} does not load cleanly (slotwise runs on with one warning, "
            "without what a failing hook registers; conformance fails): "
            + "; ".join(f"({n}) {problem}" for n, problem in enumerate(problems, 1))
        )
