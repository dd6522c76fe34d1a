"""slotwise: a hardware plugin framework for PyTorch inference code.

The core defines interfaces; hardware packages register implementations through
pluggy hooks found via the ``slotwise.plugins`` entry-point group.  Importing this
package is cheap: it never imports torch nor touches a device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotwise.version import API_VERSION, __version__

__all__ = ["API_VERSION", "__version__", "compile", "current_platform"]

if TYPE_CHECKING:
    from slotwise.platforms import Platform

    current_platform: Platform


def __getattr__(name: str) -> Any:
    # Lazy attributes: resolving the platform or loading the compiler stack happens
    # on first use, so `import slotwise` stays cheap.
    if name == "current_platform":
        from slotwise.platforms import current_platform

        return current_platform
    if name == "compile":
        from slotwise.compilation.decorators import compile

        return compile
    raise AttributeError(f"module 'slotwise' has no attribute {name!r}")
