"""What the registries passed to registration hooks share: the plugin's own platform."""

from __future__ import annotations


def own_platform(own_platforms: tuple[str, ...], method: str, error: type[Exception]) -> str:
    """The one platform the registering plugin declares, for ``registry.<method>(...)``.

    A plugin declaring none or several must name the platform: ``register(name, ...)``.
    """
    if len(own_platforms) == 1:
        return own_platforms[0]
    declares = (
        f"declares platforms {', '.join(own_platforms)}"
        if own_platforms
        else "declares no platform in its slotwise_platforms hook"
    )
    raise error(
        f"registry.{method}() registers for the plugin's own platform, but this plugin "
        f"{declares}; name the platform instead: registry.register(<platform name>, ...)"
    )
