"""The one rule for static-graph modes: what works where and which mode a model runs with.

Platform defaults, the ``GraphDispatcher`` (which decides each step's graphs from the
mode settled here), ``slotwise env``, ``slotwise matrix`` and the bench all ask these
functions, so they can never disagree about a mode, nor about why a model gets the mode
it gets.  Where slotwise has no
documented reason to differ, the semantics are vLLM's: graphs need compilation (level 2
for FULL, level 3 for the pieces), nothing split means no piecewise graphs, and a model
that runs uncompiled captures nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from slotwise.compilation.config import CompilationLevel, ConfigError, GraphMode

if TYPE_CHECKING:
    import torch

    from slotwise.compilation.config import CompilationConfig
    from slotwise.platforms import Platform

logger = logging.getLogger(__name__)


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


def check_graph_mode_level(config: CompilationConfig) -> None:
    """Raise ``ConfigError`` naming what to set when the level cannot capture the config's
    graph mode.

    Static graphs are captured around the code slotwise compiles: FULL graphs around the
    model traced once (level 2 or 3), piecewise graphs around the pieces of level 3.
    Level 0 runs the module's own forward and level 1 is plain ``torch.compile``, which
    recompiles per size; neither has a place for a graph, so asking for one there is an
    error rather than a mode silently ignored.
    """
    mode, level = config.graph_mode, config.level
    if mode in (None, GraphMode.NONE):
        return
    needs_pieces = mode.has_piecewise_graphs
    if level >= (CompilationLevel.PIECEWISE if needs_pieces else CompilationLevel.DYNAMO_ONCE):
        return
    needed = "level 3 (PIECEWISE)" if needs_pieces else "level 2 or 3"
    other = "FULL or NONE" if level == CompilationLevel.DYNAMO_ONCE else "NONE"
    raise ConfigError(
        f"compilation config key 'graph_mode': {mode.name} graphs are captured around the "
        f"model slotwise compiles and need {needed}, but level is {level.value} "
        f"({level.name}); set level=3 or graph_mode={other}"
    )


def settle_graph_mode(
    config: CompilationConfig,
    platform: Platform,
    attention_backends: Sequence[type] | None = None,
    *,
    compiled: bool = True,
) -> None:
    """Set ``config.graph_mode`` to the mode the model runs with; refuse what cannot work.

    A config without a mode gets ``default_graph_mode``, logged with its reason; an
    explicit mode is kept where it can work and otherwise changed with one warning that
    says why.  In order:

    - a mode the level cannot capture is a ``ConfigError`` (``check_graph_mode_level``);
    - ``compiled=False`` (``TORCH_COMPILE_DISABLE=1``: the model runs eagerly) gives
      NONE, which the caller's warning reports;
    - a platform without a GraphAPI turns any mode to NONE;
    - with nothing split (level 3, ``splitting_ops`` empty) the one piece holds the
      attention too, which a piecewise graph would capture without its metadata:
      PIECEWISE turns to NONE, FULL_AND_PIECEWISE to FULL where every attention backend
      allows full graphs of any batch (``graph_support`` ALWAYS), else to NONE;
    - a mode that still captures needs ``capture_sizes``: an explicit one without any is
      a ``ConfigError``, a default one becomes NONE.

    ``attention_backends``: the model's (None: the one the platform selects).
    """
    check_graph_mode_level(config)
    if not compiled:
        config.graph_mode = GraphMode.NONE
        return
    requested = config.graph_mode
    supported = supported_graph_modes(platform)
    if requested is None:
        choice = default_graph_mode(platform, attention_backends, config.level)
    elif requested not in supported:
        choice = GraphModeChoice(
            GraphMode.NONE,
            f"platform {platform.name} supports graph modes "
            f"{', '.join(mode.name for mode in supported)} only (static graphs need a GraphAPI)",
        )
    else:
        choice = GraphModeChoice(requested, "")
    if choice.mode.has_piecewise_graphs and _nothing_split(config):
        choice = _without_split(choice.mode, platform, attention_backends)
    if choice.mode != GraphMode.NONE and not config.capture_sizes:
        if requested is not None:
            raise ConfigError(
                f"compilation config key 'capture_sizes': graph_mode {requested.name} "
                f"captures graphs at the capture sizes, and there are none "
                f"({_capture_sizes_setting(config)}); give capture_sizes (or a positive "
                "max_capture_size), or set graph_mode=NONE"
            )
        choice = GraphModeChoice(
            GraphMode.NONE,
            f"there is nothing to capture ({_capture_sizes_setting(config)})",
        )
    if requested is None:
        logger.info("graph_mode %s by default: %s", choice.mode.name, choice.reason)
    elif choice.mode != requested:
        logger.warning(
            "graph_mode=%s turned to %s: %s", requested.name, choice.mode.name, choice.reason
        )
    config.graph_mode = choice.mode


def _nothing_split(config: CompilationConfig) -> bool:
    """Whether level 3 keeps the model as one piece (FX split or Inductor partition)."""
    return config.level == CompilationLevel.PIECEWISE and not config.resolved_splitting_ops


def _capture_sizes_setting(config: CompilationConfig) -> str:
    """The settings that left no capture size (max_capture_size=0 derives no sizes, and
    capture_sizes=[] derives max_capture_size 0)."""
    if config.max_capture_size == 0:
        return "capture_sizes=[], max_capture_size=0"
    return "capture_sizes=[]"


def _without_split(
    mode: GraphMode, platform: Platform, attention_backends: Sequence[type] | None
) -> GraphModeChoice:
    """What ``mode`` (one with piecewise graphs) becomes when nothing is split."""
    unsplit = (
        "splitting_ops is [], so the model is one piece, attention included, and no "
        "piecewise graph can leave attention out"
    )
    if mode == GraphMode.PIECEWISE:
        return GraphModeChoice(
            GraphMode.NONE,
            f"{unsplit}; graph_mode=FULL captures the whole model where the attention "
            "backend allows it",
        )
    if attention_backends is None:
        backend, unselectable = _selected_backend(platform)
        if backend is None:
            return GraphModeChoice(
                GraphMode.NONE,
                f"{unsplit}, and full graphs need an attention backend that may be captured "
                f"in them, but none was selected ({unselectable})",
            )
        attention_backends = [backend]
    refusing = [cls for cls in attention_backends if not _captures_every_batch(cls)]
    if refusing:
        cls = refusing[0]
        return GraphModeChoice(
            GraphMode.NONE,
            f"{unsplit}, and full graphs of every batch (FULL) cannot hold attention "
            f"backend {cls.get_name()}, whose graph_support is {cls.graph_support.name}",
        )
    return GraphModeChoice(
        GraphMode.FULL,
        f"{unsplit}; full graphs of the whole model (FULL) capture every batch instead",
    )


def sizes_padding_never_reaches(config: CompilationConfig) -> list[int]:
    """The ``compile_sizes`` no step of ``slotwise_engine.runner`` ever runs at: with graphs, a
    step of up to the largest capture size is padded to a capture size, so a compile size
    below it that is not a capture size is never a step's size."""
    if config.graph_mode in (None, GraphMode.NONE) or not config.capture_sizes:
        return []
    largest = config.capture_sizes[-1]
    captured = set(config.capture_sizes)
    return [size for size in config.compile_sizes if size < largest and size not in captured]


@dataclass(frozen=True)
class GraphModeChoice:
    """The graph mode a config without one gets, and why: logged when a model is
    compiled, shown by ``slotwise env``, ``slotwise matrix`` and the bench."""

    mode: GraphMode
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {**asdict(self), "mode": self.mode.name}


def default_graph_mode_report(platform: Platform) -> dict[str, str]:
    """``default_graph_mode(platform)`` as ``slotwise env`` and the bench show it (mode
    and reason); a plugin that raises while asked gives mode "unknown" and the error,
    since a report must still print."""
    try:
        return default_graph_mode(platform).as_dict()
    except Exception as exc:  # noqa: BLE001 - shown in the report, never hidden
        return {"mode": "unknown", "reason": f"asking raised {type(exc).__name__}: {exc}"}


def default_graph_mode(
    platform: Platform,
    attention_backends: Sequence[type] | None = None,
    level: CompilationLevel = CompilationLevel.PIECEWISE,
) -> GraphModeChoice:
    """The graph mode of a config that names none, with its reason.

    FULL_AND_PIECEWISE where the platform has a GraphAPI and every attention backend
    of the model may be captured in full graphs of uniform-decode batches (decode steps
    then replay one graph of the whole model, other batches the pieces); else
    PIECEWISE where it has a GraphAPI; else NONE.  Only level 3 captures by default:
    FULL_AND_PIECEWISE and PIECEWISE need its pieces.

    ``attention_backends`` are the model's backends ([] for a model without
    attention); None asks which one the platform selects for a layer that names no
    requirements (``select_attention_backend``), which is what a report without a model
    shows.
    """
    if level != CompilationLevel.PIECEWISE:
        return GraphModeChoice(
            GraphMode.NONE,
            f"level {level.value} ({level.name}) captures no graphs unless graph_mode is set; "
            "the default graphs need level 3 (PIECEWISE)",
        )
    if platform.get_graph_api() is None:
        return GraphModeChoice(
            GraphMode.NONE,
            f"platform {platform.name} has no static graphs (get_graph_api() is None)",
        )
    if attention_backends is None:
        backend, unselectable = _selected_backend(platform)
        if backend is None:
            return GraphModeChoice(
                GraphMode.PIECEWISE,
                f"platform {platform.name} has static graphs, but full graphs need an attention "
                f"backend that may be captured and none was selected ({unselectable}); "
                "PIECEWISE runs any attention between the pieces",
            )
        attention_backends = [backend]
    backends = list(dict.fromkeys(attention_backends))
    if not backends:
        return GraphModeChoice(
            GraphMode.FULL_AND_PIECEWISE,
            f"platform {platform.name} has static graphs and the model has no attention layer, "
            "so full graphs can hold every uniform-decode batch",
        )
    refusing = [cls for cls in backends if not _captures_uniform_decodes(cls)]
    if refusing:
        cls = refusing[0]
        return GraphModeChoice(
            GraphMode.PIECEWISE,
            f"platform {platform.name} has static graphs, but attention backend "
            f"{cls.get_name()} has graph_support {cls.graph_support.name}, so its attention "
            "runs between captured pieces, never in a full graph",
        )
    names = ", ".join(f"{cls.get_name()} ({cls.graph_support.name})" for cls in backends)
    return GraphModeChoice(
        GraphMode.FULL_AND_PIECEWISE,
        f"platform {platform.name} has static graphs and attention backend {names} may be "
        "captured in full graphs of uniform-decode batches",
    )


def attention_backends_of(module: torch.nn.Module) -> list[type]:
    """The attention backends of ``module``'s layers, each once, in layer order: what
    ``default_graph_mode`` judges a model by."""
    from slotwise.attention.layer import Attention

    layers = (m for m in module.modules() if isinstance(m, Attention))
    return list(dict.fromkeys(layer.attn_backend for layer in layers))


def _captures_uniform_decodes(attention_backend: type) -> bool:
    support = getattr(attention_backend, "graph_support", None)
    return support is None or support.captures(uniform_decode_only=True)


def _captures_every_batch(attention_backend: type) -> bool:
    support = getattr(attention_backend, "graph_support", None)
    return support is None or support.captures(uniform_decode_only=False)


def _selected_backend(platform: Platform) -> tuple[type | None, str]:
    """The backend the platform selects for default requirements, or None and why not."""
    from slotwise.attention.selector import AttentionBackendError, select_attention_backend

    try:
        return select_attention_backend(platform), ""
    except AttentionBackendError as exc:
        return None, str(exc).splitlines()[0].rstrip(":")
