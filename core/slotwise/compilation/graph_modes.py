"""The one rule for static-graph modes: what works where, and which graphs act in a step.

Platform defaults, the graph wrappers, the ``ModelRunner``, ``slotwise matrix`` and
the bench all ask these functions, so they can never disagree about a mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotwise.compilation.config import ConfigError, GraphMode

if TYPE_CHECKING:
    from slotwise.compilation.config import CompilationConfig
    from slotwise.forward_context import BatchDescriptor
    from slotwise.platforms import Platform


def supported_graph_modes(
    platform: Platform, attention_backend: type | None = None
) -> list[GraphMode]:
    """The graph modes a model can run in on ``platform`` with ``attention_backend``.

    NONE always; the others only with a GraphAPI (``Platform.get_graph_api()``).
    PIECEWISE runs attention between the captured pieces, so any backend serves it;
    FULL graphs capture attention too and need its ``graph_support``: ALWAYS for
    FULL, UNIFORM_DECODE or ALWAYS for FULL_AND_PIECEWISE.  A model without
    attention (``attention_backend`` None) can use every mode the platform has.
    """
    if platform.get_graph_api() is None:
        return [GraphMode.NONE]
    support = getattr(attention_backend, "graph_support", None)
    return [
        mode
        for mode in GraphMode
        if not mode.has_full_graphs
        or support is None
        or support.captures(uniform_decode_only=mode == GraphMode.FULL_AND_PIECEWISE)
    ]


def require_graph_mode(mode: GraphMode, platform: Platform, attention_backend: type) -> None:
    """Raise ``ConfigError`` naming the mode to use when ``mode`` cannot work here."""
    supported = supported_graph_modes(platform, attention_backend)
    if mode in supported:
        return
    if supported == [GraphMode.NONE]:
        reason = f"platform {platform.name} has no static graphs (get_graph_api() is None)"
    else:
        uniform = mode == GraphMode.FULL_AND_PIECEWISE
        reason = (
            f"{mode.name} captures the attention of "
            f"{'uniform-decode batches' if uniform else 'every batch'} in full graphs, but "
            f"backend {attention_backend.get_name()} has graph_support "
            f"{attention_backend.graph_support.name}"
        )
    raise ConfigError(
        f"compilation config key 'graph_mode': {reason}; use graph_mode={supported[-1].name}"
    )


def step_graph_mode(
    config: CompilationConfig,
    size: int | None,
    descriptor: BatchDescriptor | None = None,
    *,
    requested: GraphMode | None = None,
) -> GraphMode:
    """Which graphs act in a step of ``size`` tokens: NONE, PIECEWISE (the pieces') or
    FULL (the whole model's).

    The config decides: with graph_mode NONE nothing is ever captured.  ``requested``
    (a forward context's mode: a caller forcing one, or the FULL wrapper telling the
    pieces inside) is followed only where the config captures that kind of graph.
    Otherwise a size in ``capture_sizes`` runs with the configured graphs, and
    FULL_AND_PIECEWISE picks FULL for batches ``descriptor`` marks as uniform decode.
    """
    mode = config.graph_mode or GraphMode.NONE
    if requested == GraphMode.PIECEWISE:
        return requested if mode.has_piecewise_graphs else GraphMode.NONE
    if requested == GraphMode.FULL:
        return requested if mode.has_full_graphs else GraphMode.NONE
    if requested == GraphMode.NONE or size not in (config.capture_sizes or ()):
        return GraphMode.NONE
    if mode == GraphMode.FULL_AND_PIECEWISE:
        uniform = descriptor is not None and descriptor.uniform_decode
        return GraphMode.FULL if uniform else GraphMode.PIECEWISE
    return mode
