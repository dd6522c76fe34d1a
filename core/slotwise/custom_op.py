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
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

from torch import nn

from slotwise import api_versioning
from slotwise.compilation.context import get_current_compilation_config
from slotwise.platforms import get_current_platform
from slotwise.platforms.registries import (
    PluginRegistry,
    Registration,
    RegistryError,
    filled_registry,
)

logger = logging.getLogger(__name__)

Implementation = Callable[..., Any]


#: The ops slotwise.layers defines: a registration naming one is checked without importing
#: the layers (they sit above this module); a test keeps the two in step.
CORE_OP_NAMES = frozenset({"logits", "rms_norm", "rotary_embedding", "silu_and_mul"})


class CustomOpError(RegistryError):
    """A custom op or a replacement for one is declared wrongly."""


class CustomOpRegistry(PluginRegistry):
    """Replacements of custom ops, per op name and platform name.

    Passed to the ``slotwise_register_custom_ops`` hook.  An implementation is a
    function taking the layer first, like a method (``def rms_norm(layer, x,
    residual=None)``), or a ``"module:function"`` string imported on first use.  Of
    several replacements of one op on one platform the highest priority wins, at equal
    priority the earlier (with a warning: give the one that should win a higher one).
    """

    _error_type = CustomOpError
    _call = "registry.register(platform_name, op_name, implementation, priority=0)"

    def register(
        self,
        platform_name: str,
        op_name: str,
        implementation: Implementation | str,
        priority: int = 0,
    ) -> None:
        """Replace ``op_name`` on ``platform_name`` by ``implementation``."""
        known_ops = CORE_OP_NAMES | set(CustomOp.op_classes)
        if _in_the_old_order(platform_name, op_name, known_ops):
            platform_name, op_name = op_name, platform_name
        if op_name not in known_ops:
            known = ", ".join(sorted(known_ops))
            raise CustomOpError(
                f"cannot register a replacement for unknown custom op {op_name!r} on platform "
                f"{platform_name!r}; known ops: {known}; call {self._call}"
            )
        if not isinstance(implementation, str) and not callable(implementation):
            raise CustomOpError(
                f"replacement for custom op {op_name!r} on platform {platform_name!r} must be "
                f"a function or a 'module:function' string, got {implementation!r}; "
                f"call {self._call}"
            )
        added = self._add(
            platform_name,
            implementation,
            priority,
            what=f"replacement for custom op {op_name!r}",
            example="slotwise_myvendor.ops:rms_norm",
            name=op_name,
        )
        self._warn_on_a_tie(added, self._registrations[:-1])

    def register_own(
        self, op_name: str, implementation: Implementation | str, priority: int = 0
    ) -> None:
        """Replace ``op_name`` on the platform this plugin declares in ``slotwise_platforms``.

        The registry knows that name, so the plugin writes it once, in its spec.
        """
        self.register(self._own_platform(), op_name, implementation, priority)

    def registrations(self) -> list[tuple[str, str]]:
        return [
            (r.platform, f"a replacement for custom op {r.name!r}") for r in self._registrations
        ]

    def merge(self, other: PluginRegistry, source: str) -> None:
        """Take ``other``'s registrations (plugin ``source``'s), after the ones already here."""
        before = list(self._registrations)
        super().merge(other, source)
        for added in self._registrations[len(before) :]:
            self._warn_on_a_tie(added, before)

    def lookup(self, op_name: str, platform: str) -> Implementation | None:
        """The winning replacement of ``op_name`` on ``platform``, or None without one."""
        ranked = self._ranked(platform, op_name)
        return ranked[0].load() if ranked else None

    def entries(self) -> list[tuple[str, str]]:
        """Every (op name, platform name) with a replacement, sorted."""
        return sorted({(r.name, r.platform) for r in self._registrations})

    def _warn_on_a_tie(self, added: Registration, earlier: list[Registration]) -> None:
        rival = next(
            (
                r
                for r in earlier
                if (r.name, r.platform, r.priority) == (added.name, added.platform, added.priority)
            ),
            None,
        )
        if rival is not None:
            logger.warning(
                "custom op %r on platform %r is replaced by both %s and %s at priority %d; the "
                "first registered (%s) wins: give the one that should win a higher priority",
                added.name,
                added.platform,
                rival.source or rival.label,
                added.source or added.label,
                added.priority,
                rival.source or rival.label,
            )


def _in_the_old_order(first: object, second: object, known_ops: frozenset[str]) -> bool:
    """Whether ``register(first, second, ...)`` is the order before API 1.5,
    ``register(op_name, platform, ...)``: only when the new order cannot be meant (its
    op name would be unknown), so a valid call is never reread.  Warns when it is."""
    if not (isinstance(first, str) and isinstance(second, str)):
        return False
    if first not in known_ops or second in known_ops:
        return False
    old, new, deprecated_in = api_versioning.REORDERED_ARGUMENTS["CustomOpRegistry.register"]
    warnings.warn(
        f"CustomOpRegistry.register({first!r}, {second!r}, ...) passes ({old}), the order "
        f"deprecated in slotwise API {deprecated_in}: write register({second!r}, {first!r}, "
        f"...), that is ({new}) (the old order stops working in API "
        f"{api_versioning.removal_version(deprecated_in)})",
        DeprecationWarning,
        stacklevel=3,
    )
    return True


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
