"""Compilers: what turns one graph piece into a callable and, where it can, into a file.

The piecewise backends and the compile cache see only :class:`Compiler`, so a plugin adds
a compiler by subclassing it and naming it ``"module:Class"`` in the config's ``backend``;
there is no registry to update.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import hashlib
import inspect
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import torch.fx as fx
from torch._guards import TracingContext
from torch.utils import _pytree as pytree

from slotwise.compilation.cache.inductor_cache_dir import (
    place_inductor_cache,
    place_precompiled_headers,
)
from slotwise.compilation.cache.isa_probe_cache import install_isa_probe_cache
from slotwise.compilation.compile_counters import counters
from slotwise.compilation.config import CompilationConfig, ConfigError
from slotwise.compilation.traced_inputs import traced_inputs
from slotwise.errors import SlotwiseError
from slotwise.import_path import resolve_import_path
from slotwise.platforms import Platform, get_current_platform

logger = logging.getLogger(__name__)

#: The packages a first import of Inductor loads the most of; another package's orphans
#: may come from failures of its own, which Inductor does not care about.
_COMPILER_PACKAGES = ("torch._dynamo.", "torch._inductor.")
_ACCEPTED_BACKENDS = '"eager", "inductor" or "module:Class" naming a Compiler subclass'


class HalfImportedCompilerError(SlotwiseError, RuntimeError):
    """An earlier import of torch's compiler in this process stopped half-way (a Ctrl-C
    while ``torch._inductor`` was first imported): only a new process can compile."""


@dataclasses.dataclass(frozen=True)
class CompiledPiece:
    """A compiled graph piece; ``save`` is None when this piece cannot be written to a file."""

    fn: Callable[..., Any]
    save: Callable[[str], None] | None = None


class Compiler(abc.ABC):
    """Compiles graph pieces; subclass it to plug in a vendor compiler.

    ``compile`` is called once for the general shape (``runtime_shape=None``; the example
    inputs may be fake tensors with symbolic sizes and SymInts, inside a Dynamo backend
    call) and once per specialised size (real runtime tensors as example inputs).
    """

    name: ClassVar[str] = "compiler"
    #: Whether ``load`` can rebuild what ``CompiledPiece.save`` wrote; the cache skips the
    #: disk entirely for compilers that cannot.
    supports_persistence: ClassVar[bool] = False

    def __init__(self, config: CompilationConfig) -> None:
        _check_compiler_imports_whole()
        self.config = config

    def compute_hash(self) -> str:
        """Hash of this compiler's own settings that change its output, for cache keys
        (the versions of slotwise, torch and Python and the device are keyed already)."""
        return ""

    @abc.abstractmethod
    def compile(
        self, graph: fx.GraphModule, example_inputs: Sequence[Any], *, runtime_shape: int | None
    ) -> CompiledPiece:
        """Compile ``graph``; the result's ``fn(*args)`` returns what ``graph`` returns."""

    def load(
        self,
        path: str,
        graph: fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        runtime_shape: int | None,
    ) -> Callable[..., Any]:
        """Rebuild what ``CompiledPiece.save(path)`` wrote; ``path`` may go once this returns."""
        raise NotImplementedError(f"compiler {self.name!r} cannot load saved pieces")


class EagerCompiler(Compiler):
    """Runs the graph as traced: the reference the other compilers are tested against."""

    name = "eager"

    def compile(
        self, graph: fx.GraphModule, example_inputs: Sequence[Any], *, runtime_shape: int | None
    ) -> CompiledPiece:
        counters.bump("num_eager_compiles")
        return CompiledPiece(fn=graph.forward)


class InductorCompiler(Compiler):
    """Inductor through ``torch._inductor.standalone_compile``, whose artifacts can be saved."""

    name = "inductor"
    supports_persistence = True

    def __init__(self, config: CompilationConfig) -> None:
        super().__init__(config)
        # Before Inductor is imported, which fixes its folder at the default when unset.
        place_inductor_cache(config.resolved_cache_dir if config.cache_enabled else None)
        import torch._inductor  # costly: only when Inductor is chosen

        check_inductor_targets(get_current_platform())
        if not hasattr(torch._inductor, "standalone_compile"):
            raise ConfigError(
                f"compilation config key 'backend': 'inductor' needs "
                f"torch._inductor.standalone_compile, which torch {torch.__version__} lacks; "
                f"upgrade torch (2.8 or newer has it) or use backend 'eager'"
            )
        if config.cache_enabled:
            install_isa_probe_cache(config.resolved_cache_dir)
        self.options: dict[str, Any] = dict(config.inductor_config)
        try:
            with torch._inductor.config.patch(self.options):
                pass
        except AttributeError as err:
            raise ConfigError(
                f"compilation config key 'inductor_config': {err}; accepted: option names of "
                "torch._inductor.config"
            ) from None
        place_precompiled_headers()
        if get_current_platform().device_type == "cpu":
            _check_cpp_compiler(config, self.options)

    def compute_hash(self) -> str:
        """Hash of the Inductor options and the vector ISA they pick; the versions and the
        machine are keyed in other groups (:mod:`slotwise.compilation.cache.cache_key`)."""
        factors = {
            "options": self.options,
            # A shared cache must not hand AVX-512 code to a CPU that picks AVX2.
            "cpu_vector_isa": self._cpu_vector_isa(),
        }
        canonical = json.dumps(factors, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def _cpu_vector_isa(self) -> str:
        """The vector ISA Inductor's C++ code is written for here (``ATEN_CPU_CAPABILITY``
        and the ``cpp.simdlen`` option choose among those the CPU runs)."""
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        with torch._inductor.config.patch(self.options):
            return str(pick_vec_isa())

    def compile(
        self, graph: fx.GraphModule, example_inputs: Sequence[Any], *, runtime_shape: int | None
    ) -> CompiledPiece:
        from torch._inductor import standalone_compile

        flat_graph, spec = _flat_output_graph(graph)
        dynamic_shapes = _dynamic_shapes_source(runtime_shape)
        inputs = list(example_inputs)
        if dynamic_shapes == "from_tracing_context":
            inputs = traced_inputs(inputs)
        artifact = standalone_compile(
            flat_graph,
            inputs,
            dynamic_shapes=dynamic_shapes,
            options={"config_patches": dict(self.options)},
            **_donation(standalone_compile, donate=flat_graph is not graph),
        )
        counters.bump("num_inductor_compiles")
        # AOTAutograd refuses to cache some graphs (e.g. calls of arbitrary Python
        # functions); those artifacts hold nothing to save.
        save = None
        if getattr(artifact, "is_saveable", lambda: True)():
            save = _artifact_saver(artifact)
        else:
            logger.info("Inductor made no saveable artifact for this piece; it is not cached")
        return CompiledPiece(fn=_unflattening(artifact, spec), save=save)

    def load(
        self,
        path: str,
        graph: fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        runtime_shape: int | None,
    ) -> Callable[..., Any]:
        from torch._inductor import CompiledArtifact

        artifact = CompiledArtifact.load(path=path, format="binary")
        return _unflattening(artifact, _output_spec(graph))


def _check_compiler_imports_whole() -> None:
    """Refuse to compile after the first import of torch's compiler stopped half-way.

    Such an import leaves submodules without their packages in ``sys.modules``, and
    importing again fails later with errors that blame something else.
    """
    loaded = set(sys.modules)
    orphans = sorted(
        name
        for name in loaded
        if name.startswith(_COMPILER_PACKAGES) and name.rpartition(".")[0] not in loaded
    )
    if orphans:
        raise HalfImportedCompilerError(
            "an earlier import of torch's compiler (torch._dynamo, torch._inductor) in this "
            f"process was interrupted (Ctrl-C) or failed half-way: {orphans[0]} is loaded "
            "without its package "
            f"{orphans[0].rpartition('.')[0]}, and importing it again would fail with a "
            "misleading error; restart the Python process"
        )


def check_inductor_targets(platform: Platform) -> None:
    """Refuse Inductor where it has no code generator for ``platform``'s device type,
    whose first compile would otherwise fail with a bare ``KeyError``; imports Inductor."""
    from torch._inductor.codegen.common import (
        get_scheduling_for_device,
        init_backend_registration,
    )

    init_backend_registration()
    if get_scheduling_for_device(platform.device_type) is not None:
        return
    problem = (
        f"compilation config key 'backend': 'inductor' cannot compile for platform "
        f"{platform.name!r}: Inductor has no code generator for its device type "
        f"{platform.device_type!r}"
    )
    default = platform.default_compile_backend
    if default != "inductor":
        raise ConfigError(
            f"{problem}; use the platform's default backend {default!r} (leave 'backend' "
            f"unset, or -O.backend={default})"
        )
    raise ConfigError(
        f"{problem}, yet the platform ({type(platform).__module__}."
        f"{type(platform).__qualname__}) names it as its default_compile_backend; use "
        "backend 'eager' (-O.backend=eager), and have the plugin set "
        "default_compile_backend = 'eager' or register an Inductor backend for "
        f"{platform.device_type!r} (torch._inductor.codegen.common.register_backend_for_device)"
    )


def _check_cpp_compiler(config: CompilationConfig, options: dict[str, Any]) -> None:
    """Stop before the first compile when no C++ compiler Inductor would use is on the PATH."""
    from torch._inductor import config as inductor_config

    with inductor_config.patch(options):
        searched = inductor_config.cpp.cxx
    candidates = searched if isinstance(searched, (list, tuple)) else (searched,)
    names = [name for name in candidates if name]
    if any(shutil.which(name) for name in names):
        return
    if None in candidates and os.environ.get("TORCH_INDUCTOR_INSTALL_GXX"):
        return  # Inductor installs g++ through conda itself
    shown = " or ".join(repr(name) for name in names) or "none configured"
    raise ConfigError(
        f"compilation level {config.level.value} with the Inductor backend on the CPU needs "
        f"a C++ compiler, and {shown} (torch._inductor.config.cpp.cxx, from $CXX) is not "
        "on the PATH: install g++ (or point CXX at a C++ compiler), or compile at level 0 "
        "(-O0 or SLOTWISE_COMPILATION_CONFIG='{\"level\": 0}')"
    )


def _donation(standalone_compile: Callable[..., Any], *, donate: bool) -> dict[str, bool]:
    """``donate_graph_module`` where this torch's standalone_compile takes it (2.13 does,
    2.11 does not), so a graph made for the compile is not deep-copied again."""
    if "donate_graph_module" in inspect.signature(standalone_compile).parameters:
        return {"donate_graph_module": donate}
    return {}


def _dynamic_shapes_source(runtime_shape: int | None) -> str:
    """Where standalone_compile takes its shape information from: inside a Dynamo backend
    call, the tracing context whose fake mode owns the example inputs' symbols."""
    if runtime_shape is not None:
        return "from_example_inputs"
    if TracingContext.try_get() is not None:
        return "from_tracing_context"
    return "from_graph"


def _output_spec(graph: fx.GraphModule) -> pytree.TreeSpec:
    (result,) = graph.graph.output_node().args
    return pytree.tree_flatten(result)[1]


def _flat_output_graph(graph: fx.GraphModule) -> tuple[fx.GraphModule, pytree.TreeSpec]:
    """``graph``, or a copy returning a flat tuple, and the structure of its real output
    (a loaded artifact returns the flat list, so the structure is restored here)."""
    spec = _output_spec(graph)
    (result,) = graph.graph.output_node().args
    if isinstance(result, (tuple, list)) and all(isinstance(item, fx.Node) for item in result):
        return graph, spec
    flat = copy.deepcopy(graph)
    flat_output = flat.graph.output_node()
    flat_leaves = pytree.tree_leaves(flat_output.args[0])
    with flat.graph.inserting_before(flat_output):
        flat.graph.output(tuple(flat_leaves))
    flat.graph.erase_node(flat_output)
    flat.recompile()
    return flat, spec


def _unflattening(artifact: Callable[..., Any], spec: pytree.TreeSpec) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return pytree.tree_unflatten(list(artifact(*args)), spec)

    return run


def _artifact_saver(artifact: Any) -> Callable[[str], None]:
    def save(path: str) -> None:
        artifact.save(path=path, format="binary")

    return save


def make_compiler(backend: str, config: CompilationConfig) -> Compiler:
    """The compiler named by a resolved backend ("" must be resolved by the platform first)."""
    if backend == "eager":
        return EagerCompiler(config)
    if backend == "inductor":
        return InductorCompiler(config)
    compiler_cls = resolve_import_path(
        backend,
        what="compilation config key 'backend'",
        fix=f"accepted: {_ACCEPTED_BACKENDS}",
        expected_type=Compiler,
        error=ConfigError,
    )
    return compiler_cls(config)
