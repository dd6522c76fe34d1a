"""What the core fills in after ``Platform.check_and_update_config``, on every platform.

``compiled_forward`` runs the platform's hook first, then :func:`apply_platform_defaults`,
always: a platform cannot override this step, only set fields before it (a backend, a
graph mode), which are kept where they can work. What the hook left unset is filled in
here, and what cannot work on the platform is refused or turned off, the same way for
every plugin.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from slotwise.compilation.config import CompilationLevel, ConfigError, GraphMode
from slotwise.compilation.static_graphs.graph_modes import default_graph_mode, supported_graph_modes

if TYPE_CHECKING:
    from slotwise.compilation.config import CompilationConfig
    from slotwise.platforms import Platform

logger = logging.getLogger("slotwise")


def apply_platform_defaults(
    platform: Platform,
    config: CompilationConfig,
    attention_backends: Sequence[type] | None = None,
) -> None:
    """Fill in what the platform's hook left unset (the compile backend, the graph mode);
    refuse what cannot work. Runs after ``Platform.check_and_update_config``, always.

    A config without a graph mode gets ``default_graph_mode`` for the model's
    ``attention_backends`` (None: the backend the platform selects), its reason logged.
    A graph mode the user asked for on a platform without static graphs is turned
    off with a warning; a mode that contradicts the level is a ConfigError, since
    guessing which of the two settings the user meant would be a silent fallback.
    """
    if not config.backend:
        config.backend = platform.default_compile_backend
    if config.graph_mode is not None and (
        config.graph_mode.has_piecewise_graphs and config.level != CompilationLevel.PIECEWISE
    ):
        raise ConfigError(
            f"compilation config key 'graph_mode': {config.graph_mode.name} needs piecewise "
            f"compilation, but level is {config.level.name}; set level=3 or graph_mode=FULL/NONE"
        )
    supported = supported_graph_modes(platform)
    if config.graph_mode is None:
        choice = default_graph_mode(platform, attention_backends, config.level)
        logger.info("graph_mode %s by default: %s", choice.mode.name, choice.reason)
        config.graph_mode = choice.mode
    elif config.graph_mode not in supported:
        logger.warning(
            "platform %s supports graph modes %s only (static graphs need a GraphAPI): "
            "graph_mode=%s turned to NONE",
            platform.name,
            ", ".join(mode.name for mode in supported),
            config.graph_mode.name,
        )
        config.graph_mode = GraphMode.NONE
    if config.use_inductor_graph_partition:
        import torch

        from slotwise.compilation.splitting.inductor_partition import check_partition_supported

        check_partition_supported(torch.__version__)
    if config.use_inductor_graph_partition and config.backend != "inductor":
        raise ConfigError(
            "compilation config key 'use_inductor_graph_partition': needs backend='inductor', "
            f"got backend={config.backend!r}"
        )
