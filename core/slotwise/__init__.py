"""slotwise: a hardware plugin framework for PyTorch inference code.

The core defines interfaces; hardware packages register implementations through
pluggy hooks found via the ``slotwise.plugins`` entry-point group.  Importing this
package is cheap: it never imports torch nor touches a device.

Other distributions add modules to this package: the ``slotwise/`` folder of every
``sys.path`` entry is part of it (``pkgutil.extend_path``), which is how the
slotwise-engine distribution provides ``slotwise.models`` and ``slotwise.runner``.
Without it, importing those names says which distribution to install.
"""

from __future__ import annotations

from pkgutil import extend_path
from typing import TYPE_CHECKING

from slotwise.lazy_exports import lazy_exports
from slotwise.missing_distribution import install_missing_engine_finder
from slotwise.version import API_VERSION, __version__

__path__ = extend_path(__path__, __name__)
install_missing_engine_finder()

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
