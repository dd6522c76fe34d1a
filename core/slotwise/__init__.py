"""slotwise: a hardware plugin framework for PyTorch inference code.

The core defines interfaces; hardware packages register implementations through
pluggy hooks found via the ``slotwise.plugins`` entry-point group.  Importing this
package is cheap: it never imports torch nor touches a device.

The inference engine (models, runner, ``slotwise generate``) is its own package,
``slotwise_engine``, in the slotwise-engine distribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotwise.lazy_exports import lazy_exports
from slotwise.version import API_VERSION, __version__

__all__ = ["API_VERSION", "__version__", "compile", "current_platform"]

if TYPE_CHECKING:
    from slotwise.platforms import Platform

    current_platform: Platform

# Resolving the platform or loading the compiler stack happens on first use, so
# `import slotwise` stays cheap.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {"current_platform": "slotwise.platforms", "compile": "slotwise.compilation.decorators"},
)
