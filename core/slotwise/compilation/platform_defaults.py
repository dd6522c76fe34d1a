"""What the core fills in after ``Platform.check_and_update_config``, on every platform.

``compiled_forward`` runs the platform's hook first, then :func:`apply_platform_defaults`,
always: a platform cannot override this step, only set fields before it (a backend, a
graph mode), which are kept where they can work. What the hook left unset is filled in
here, and what cannot work on the platform is refused or turned off, the same way for
every plugin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from slotwise.compilation.config import ConfigError
from slotwise.compilation.static_graphs.graph_modes import settle_graph_mode

if TYPE_CHECKING:
    from slotwise.compilation.config import CompilationConfig
    from slotwise.platforms import Platform


def apply_platform_defaults(
    platform: Platform,
    config: CompilationConfig,
    attention_backends: Sequence[type] | None = None,
    *,
    compiled: bool = True,
) -> None:
    """Fill in what the platform's hook left unset (the compile backend, the graph mode);
    refuse what cannot work. Runs after ``Platform.check_and_update_config``, always.

    The graph mode is ``graph_modes.settle_graph_mode``'s: the default for the model's
    ``attention_backends`` (None: the backend the platform selects), logged with its
    reason; an explicit mode kept where it can work, else changed with one warning or
    refused with a ConfigError. ``compiled=False``: the model runs uncompiled
    (``TORCH_COMPILE_DISABLE=1``), so it captures nothing.
    """
    if not config.backend:
        config.backend = platform.default_compile_backend
    settle_graph_mode(config, platform, attention_backends, compiled=compiled)
    if config.use_inductor_graph_partition:
        import torch

        from slotwise.compilation.splitting.inductor_partition import check_partition_supported

        check_partition_supported(torch.__version__)
    if config.use_inductor_graph_partition and config.backend != "inductor":
        raise ConfigError(
            "compilation config key 'use_inductor_graph_partition': needs backend='inductor', "
            f"got backend={config.backend!r}"
        )
