"""Launching a Triton kernel through its compiled kernel, bound once per specialisation.

``kernel[grid](*args)`` passes through Triton's JIT on every call: it binds the arguments
to the kernel's signature, works out how each one specialises the code (its dtype; for a
pointer whether the address is a multiple of 16; for an integer whether it is 1 or a
multiple of 16), hashes that into a key and looks the compiled kernel up.  That costs
about 10 µs of host time a launch, paid per layer and step.  A compiled kernel serves
every launch whose arguments specialise as those it was compiled for did, so a
``KernelLauncher`` asks Triton for it once per specialisation key
(``JITFunction.warmup``) and then launches it directly (``CompiledKernel[grid]``,
Triton's own launcher, which takes the current stream at each call, so launches are
captured into CUDA graphs as the JIT's are).

The caller names the key: whatever of its arguments Triton specialises on, except the
addresses of the pointers at ``aligned`` positions, whose 16-byte alignment the plan
reads at every call.  Arguments that change from call to call (counts, a block table's
width) belong in the kernel's ``do_not_specialize`` lists, so neither path compiles again
for them.

Where the bound path cannot work (Triton's interpreter, a kernel that is not a
``JITFunction``, a binding that fails) the launcher goes through the JIT, after one log
record saying why.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

logger = logging.getLogger("slotwise")

#: Compiles (or finds) the kernel for one set of arguments: (kernel, grid, args,
#: constexprs) -> a compiled kernel, launched as ``compiled[grid](*args, *constexprs)``.
Compile = Callable[[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]], Any]
#: Why ``kernel`` cannot be launched bound, or None when it can.
Unbound = Callable[[Any], "tuple[int, str] | None"]


def compile_with_warmup(
    kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constants: dict[str, Any]
) -> Any:
    """Triton's compiled kernel for these arguments: compiled now, or from its cache."""
    from triton.compiler import CompiledKernel

    compiled = kernel.warmup(*args, grid=grid, **constants)
    if not isinstance(compiled, CompiledKernel):  # a compile hook or asynchronous compile
        raise TypeError(f"JITFunction.warmup returned {type(compiled).__name__}")
    return compiled


def why_unbound(kernel: Any) -> tuple[int, str] | None:
    """Why ``kernel`` launches through the JIT, with the log level it deserves."""
    from triton.runtime import JITFunction
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(kernel, InterpretedFunction):
        return logging.INFO, "Triton's interpreter runs it (TRITON_INTERPRET=1)"
    if not isinstance(kernel, JITFunction):
        return logging.WARNING, f"it is a {type(kernel).__name__}, not a triton JITFunction"
    return None


class KernelLauncher:
    """One kernel's launches: compiled kernels bound once per key, for the whole process."""

    def __init__(
        self,
        kernel: Any,
        *,
        compile: Compile = compile_with_warmup,
        unbound: Unbound = why_unbound,
    ) -> None:
        self.kernel = kernel
        self._compile = compile
        self._unbound = unbound
        self._compiled: dict[Hashable, Any] = {}
        #: Why launches go through the JIT; None while the bound path works.
        self.fallback_reason: str | None = None
        self._checked = False

    @property
    def name(self) -> str:
        return getattr(self.kernel, "__name__", type(self.kernel).__name__)

    def plan(
        self,
        grid: tuple[int, ...],
        constants: dict[str, Any],
        key: Hashable,
        aligned: Sequence[int],
    ) -> LaunchPlan:
        """The launches of one grid and one set of constexprs, for arguments that
        specialise as ``key`` says apart from the alignment of those at ``aligned``."""
        return LaunchPlan(self, grid, constants, key, tuple(aligned))

    def bind_and_launch(
        self, grid: tuple[int, ...], args: tuple[Any, ...], constants: dict[str, Any], key: Hashable
    ) -> tuple[Callable[..., None], tuple[Any, ...]]:
        """Launch ``args`` on ``grid``; return how to launch arguments laid out as they
        are again: the compiled kernel of ``key`` (compiled on its first use) and the
        constexprs that follow the arguments, in the kernel's order.  The first binding
        or bound launch that fails is logged, and from then on the JIT launches."""
        if not self._checked:
            self._checked = True
            reason = self._unbound(self.kernel)
            if reason is not None:
                self._fall_back(*reason)
        if self.fallback_reason is None:
            try:
                compiled = self._compiled.get(key)
                if compiled is None:
                    compiled = self._compile(self.kernel, grid, args, constants)
                    self._compiled[key] = compiled
                run = compiled[grid]
                names = self.kernel.arg_names[len(args) :]
                constexprs = tuple(constants[name] for name in names)
                run(*args, *constexprs)
            except Exception as error:  # noqa: BLE001  the JIT launches it, or says why not
                reason = f"binding or launching its compiled kernel failed: {error!r}"
                self._fall_back(logging.WARNING, reason)
            else:
                return run, constexprs
        launch = self.kernel[grid]

        def through_jit(*args: Any) -> None:
            launch(*args, **constants)

        through_jit(*args)
        return through_jit, ()

    def _fall_back(self, level: int, reason: str) -> None:
        self.fallback_reason = reason
        logger.log(
            level, "Triton kernel %s launches through the JIT on every call: %s", self.name, reason
        )


class LaunchPlan:
    """One grid's launches, bound on the first call for each alignment of the pointers
    the kernel specialises on; every later call launches straight away."""

    __slots__ = ("_runs", "aligned", "constants", "grid", "key", "launcher")

    def __init__(
        self,
        launcher: KernelLauncher,
        grid: tuple[int, ...],
        constants: dict[str, Any],
        key: Hashable,
        aligned: tuple[int, ...],
    ) -> None:
        self.launcher = launcher
        self.grid = grid
        self.constants = constants
        self.key = key
        self.aligned = aligned
        self._runs: dict[Hashable, tuple[Callable[..., None], tuple[Any, ...]]] = {}

    def bind(self, *args: Any) -> Callable[[], None]:
        """A call that launches ``args`` as they are, with nothing looked up: the
        compiled kernel of their alignment with them bound, where one is bound already
        (after a launch of arguments aligned so), else this plan's own launch of them."""
        bound = self._runs.get(self._alignment(args))
        if bound is None:
            return functools.partial(self, *args)
        run, constexprs = bound
        return functools.partial(run, *args, *constexprs)

    def _alignment(self, args: tuple[Any, ...]) -> Hashable:
        """True when the pointers at ``aligned`` are all 16-byte aligned (the usual
        case), else which of them are."""
        addresses = 0
        for position in self.aligned:
            addresses |= args[position].data_ptr()
        return (
            True
            if addresses % 16 == 0
            else tuple(args[position].data_ptr() % 16 == 0 for position in self.aligned)
        )

    def __call__(self, *args: Any) -> None:
        alignment = self._alignment(args)
        bound = self._runs.get(alignment)
        if bound is None:
            key = (self.key, alignment)
            self._runs[alignment] = self.launcher.bind_and_launch(
                self.grid, args, self.constants, key
            )
        else:
            run, constexprs = bound
            run(*args, *constexprs)
