"""``CustomOp``: a layer with one reference implementation and per-platform fast ones.

Subclasses write ``forward_native`` (plain torch, what compilers see through) and
optionally ``forward_cpu``, ``forward_cuda`` or ``forward_oot``.  Which one runs
is decided once, at construction:

1. the ``custom_ops`` compilation setting may turn the op off (``-name``,
   ``none``, or the default ``none`` under Inductor at level 3, which fuses the
   native code better than it calls an opaque kernel; not for an op that runs
   outside the compiled model, ``inside_compiled_graphs = False``, which Inductor
   never sees): then ``forward_native``;
2. a replacement a plugin registered for this op and the current platform
   (hook ``slotwise_register_custom_ops``) wins, without any change to model code;
3. else ``forward_<platform.custom_op_key>`` if the class defines it, else
   ``forward_native``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from torch import nn

from slotwise.compilation.context import get_current_compilation_config
from slotwise.errors import SlotwiseError
from slotwise.import_path import check_import_path, resolve_import_path
from slotwise.platforms import get_current_platform
from slotwise.platforms.registries import filled_registry
from slotwise.plugins.registration import own_platform

logger = logging.getLogger("slotwise")

Implementation = Callable[..., Any]


#: The ops slotwise.layers defines: a registration naming one is checked without importing
#: the layers (they sit above this module); a test keeps the two in step.
CORE_OP_NAMES = frozenset({"logits", "rms_norm", "rotary_embedding", "silu_and_mul"})


class CustomOpError(SlotwiseError, ValueError):
    """A custom op or a replacement for one is declared wrongly."""


class CustomOpRegistry:
    """Replacements of custom ops, per op name and platform name.

    Passed to the ``slotwise_register_custom_ops`` hook.  An implementation is a
    function taking the layer first, like a method (``def rms_norm(layer, x,
    residual=None)``), or a ``"module:function"`` string imported on first use.
    """

    def __init__(self, own_platforms: tuple[str, ...] = ()) -> None:
        self._entries: dict[tuple[str, str], Implementation | str] = {}
        self._sources: dict[tuple[str, str], str] = {}
        #: The platforms the registering plugin declares, for ``register_own``.
        self.own_platforms = own_platforms

    def register(self, op_name: str, platform: str, implementation: Implementation | str) -> None:
        known_ops = CORE_OP_NAMES | set(CustomOp.op_classes)
        if op_name not in known_ops:
            known = ", ".join(sorted(known_ops))
            raise CustomOpError(
                f"cannot register a replacement for unknown custom op {op_name!r}; "
                f"known ops: {known}"
            )
        if isinstance(implementation, str):
            check_import_path(
                implementation,
                f"replacement for custom op {op_name!r}",
                fix="give a 'module:function' string such as 'slotwise_myvendor.ops:rms_norm'"
                ", or the function itself",
                error=CustomOpError,
            )
        elif not callable(implementation):
            raise CustomOpError(f"replacement for {op_name!r} must be callable")
        self._entries[(op_name, platform)] = implementation

    def register_own(self, op_name: str, implementation: Implementation | str) -> None:
        """Replace ``op_name`` on the platform this plugin declares in ``slotwise_platforms``.

        The registry knows that name, so the plugin writes it once, in its spec.
        """
        platform = own_platform(self.own_platforms, "register_own", CustomOpError)
        self.register(op_name, platform, implementation)

    def registrations(self) -> list[tuple[str, str]]:
        return [(platform, f"a replacement for custom op {op!r}") for op, platform in self._entries]

    def merge(self, other: CustomOpRegistry, source: str) -> None:
        """Take ``other``'s entries (one plugin's); a clash keeps the later one, loudly."""
        for key, implementation in other._entries.items():
            if key in self._entries:
                logger.warning(
                    "custom op %r on platform %r is replaced by both %s and %s; %s wins",
                    *key,
                    self._sources[key],
                    source,
                    source,
                )
            self._entries[key] = implementation
            self._sources[key] = source

    def lookup(self, op_name: str, platform: str) -> Implementation | None:
        entry = self._entries.get((op_name, platform))
        if isinstance(entry, str):
            entry = resolve_import_path(
                entry,
                what=f"replacement for custom op {op_name!r} on platform {platform!r} from "
                f"{self._sources.get((op_name, platform), 'a plugin')}",
                fix="fix or uninstall the plugin that registers it",
                error=CustomOpError,
            )
            self._entries[(op_name, platform)] = entry
        return entry

    def entries(self) -> list[tuple[str, str]]:
        return sorted(self._entries)


def get_custom_op_registry() -> CustomOpRegistry:
    """The process's registry, filled by the plugins' hooks on first use."""
    return filled_registry("slotwise_register_custom_ops", CustomOpRegistry)


class CustomOp(nn.Module):
    """Base class of layers with platform-specific implementations; see the module doc."""

    #: Name used by ``custom_ops`` settings and replacement registrations.
    op_name: ClassVar[str] = ""
    #: Every CustomOp subclass by ``op_name``.
    op_classes: ClassVar[dict[str, type[CustomOp]]] = {}
    #: False for an op that runs after the compiled model (the LM head): its
    #: implementation is chosen as with the eager backend, since Inductor never sees it.
    inside_compiled_graphs: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.op_name:
            raise CustomOpError(f"{cls.__qualname__} must set the class attribute op_name")
        owner = CustomOp.op_classes.get(cls.op_name)
        if owner is not None and (owner.__module__, owner.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):
            raise CustomOpError(
                f"custom op name {cls.op_name!r} is taken by "
                f"{owner.__module__}.{owner.__qualname__}; "
                f"choose another op_name for {cls.__qualname__}"
            )
        CustomOp.op_classes[cls.op_name] = cls

    def __init__(self) -> None:
        super().__init__()
        self._forward_impl, self.implementation = self._choose_forward()

    def _choose_forward(self) -> tuple[Implementation, str]:
        config = get_current_compilation_config()
        platform = get_current_platform()
        backend = config.backend or platform.default_compile_backend
        if not self.inside_compiled_graphs:
            backend = "eager"
        if not config.custom_op_enabled(self.op_name, resolved_backend=backend):
            return self.forward_native, "native"
        replacement = get_custom_op_registry().lookup(self.op_name, platform.name)
        if replacement is not None:
            return functools.partial(replacement, self), "plugin"
        method = getattr(self, f"forward_{platform.custom_op_key}", None)
        if method is None:
            return self.forward_native, "native"
        return method, platform.custom_op_key

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_impl(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__} must implement forward_native")

    def extra_repr(self) -> str:
        return f"implementation={self.implementation}"
