"""Paths: how a warm process reaches each value a trace read, without Dynamo.

Dynamo names every value it reads (a graph input, a guarded constant) by a source, an
object of its own that only its running frame can evaluate. The cold process writes each
source down as a path that pickles: a root in the call's frame, then attribute, item and
size lookups. A warm process follows paths on its own: each check's once, when it loads
the trace (:func:`path_resolver`), and the graph inputs' through one compiled expression
(:func:`gatherer`); calls then fetch the inputs through the direct entry, which reads the
same paths.
"""

from __future__ import annotations

import builtins
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

# A path from the call's frame to a value: a root, ("local", name) | ("global", name) |
# ("import", module) | ("builtins", None), then steps ("attr", name) | ("item", key) |
# ("generic_attr", name) | ("dict_item", key) | ("type", None) | ("type_dict", None) |
# ("size", dim) | ("stride", dim).
Step = tuple[str, Any]
Path = list[Step]


# Raised by every warm-start module while it records a trace, and caught by the store,
# which logs why the trace is not saved; defined here, in the module the others build on.
class Unpersistable(Exception):
    """This trace needs Dynamo's own bytecode or guards at run time; it is not saved."""


def path_of(source: Any, trace: Any) -> Path:
    """The path of Dynamo's ``source``; Unpersistable when it is not one a warm process
    can follow (only sources whose meaning is plain attribute, item and size lookups)."""
    from torch._dynamo import source as sources

    kind = type(source)
    if kind is sources.LocalSource and not source.is_derefed_cell_contents:
        return [("local", source.local_name)]
    if kind is sources.GlobalSource:
        return [_global_root(source.global_name, trace)]
    if kind is sources.ImportSource:
        return [("import", source.module_name)]
    if kind in (
        sources.NNModuleSource,
        sources.UnspecializedNNModuleSource,
        sources.UnspecializedBuiltinNNModuleSource,
    ):
        return path_of(source.base, trace)
    if kind in (
        sources.AttrSource,
        sources.CellContentsSource,
        sources.UnspecializedParamBufferSource,
    ):
        return [*path_of(source.base, trace), ("attr", source.member)]
    if kind is sources.GenericAttrSource:
        return [*path_of(source.base, trace), ("generic_attr", source.member)]
    if kind in (sources.GetItemSource, sources.ListGetItemSource, sources.DictGetItemSource):
        if not getattr(source, "index_is_slice", False) and type(source.index) in (str, int):
            return [*path_of(source.base, trace), ("item", source.index)]
    if kind is sources.DictSubclassGetItemSource and type(source.index) in (str, int):
        return [*path_of(source.base, trace), ("dict_item", source.index)]
    if kind is sources.DefaultsSource:
        return [*path_of(source.base, trace), ("attr", source.field), ("item", source.idx_key)]
    if kind in (sources.ClosureSource, sources.CodeSource, sources.TypeMROSource):
        member = {
            sources.ClosureSource: "__closure__",
            sources.CodeSource: "__code__",
            sources.TypeMROSource: "__mro__",
        }[kind]
        return [*path_of(source.base, trace), ("attr", member)]
    if kind is sources.TypeSource:
        return [*path_of(source.base, trace), ("type", None)]
    if kind is sources.TypeDictSource:
        return [*path_of(source.base, trace), ("type_dict", None)]
    if kind is sources.TensorPropertySource and type(source.idx) is int:
        prop = {sources.TensorProperty.SIZE: "size", sources.TensorProperty.STRIDE: "stride"}
        if source.prop in prop:
            return [*path_of(source.base, trace), (prop[source.prop], source.idx)]
    raise Unpersistable(f"the trace reads {source.name}, which a warm start cannot fetch")


def _global_root(name: str, trace: Any) -> Step:
    """A global of the traced frame; Dynamo's own aliases become what they stand for."""
    if name in trace.import_sources:
        return ("import", trace.import_sources[name])
    if name == trace.name_of_builtins_dict_key_in_fglobals:
        return ("builtins", None)
    if name in trace.installed_globals:
        raise Unpersistable(f"the trace reads {name}, a global Dynamo installed")
    return ("global", name)


def path_resolver(arguments: dict[str, Any], scope: dict[str, Any]) -> Callable[[Path], Any]:
    """Follows paths from the call's locals ``arguments`` and the model module's globals
    ``scope``, each prefix once (checks share long prefixes, such as a layer's path)."""
    resolved: dict[str, Any] = {}

    def resolve(path: Path) -> Any:
        key = repr(path)
        if key not in resolved:
            resolved[key] = (
                _root(path[0], arguments, scope)
                if len(path) == 1
                else _step(resolve(path[:-1]), *path[-1])
            )
        return resolved[key]

    return resolve


def _root(root: Step, arguments: dict[str, Any], scope: dict[str, Any]) -> Any:
    kind, name = root
    if kind == "local":
        return arguments[name]
    if kind == "global":
        return scope[name]
    if kind == "import":
        return importlib.import_module(name)  # as Dynamo does when it traces
    if kind == "builtins":
        return vars(builtins)
    raise ValueError(f"bad path root {root}")


def _step(value: Any, kind: str, argument: Any) -> Any:
    if kind == "attr":
        return getattr(value, argument)
    if kind == "item":
        return value[argument]
    if kind == "generic_attr":
        return object.__getattribute__(value, argument)
    if kind == "dict_item":
        return dict.__getitem__(value, argument)
    if kind == "type":
        return type(value)
    if kind == "type_dict":
        return dict(value.__dict__)
    if kind == "size":
        return value.size(argument)
    if kind == "stride":
        return value.stride(argument)
    raise ValueError(f"bad path step {kind}")


_GATHER_ROOTS = {"local": "L", "global": "G", "import": "M"}


def gatherable(path: Path) -> bool:
    """Whether :func:`gatherer` can compile ``path`` into its expression."""
    (root, name), steps = path[0], path[1:]
    if root not in _GATHER_ROOTS or not isinstance(name, str):
        return False
    return all(
        (kind == "attr" and isinstance(value, str) and value.isidentifier())
        or (kind == "item" and type(value) in (str, int))
        or (kind == "size" and type(value) is int)
        for kind, value in steps
    )


def lookups(steps: Sequence[tuple[str, Any]]) -> str:
    """Python text of a path's attribute, item and size steps, after its root."""
    text = {"attr": ".{}", "item": "[{!r}]", "size": ".size({})"}
    return "".join(text[kind].format(value) for kind, value in steps)


def gatherer(
    paths: list[Path], scope: dict[str, Any]
) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """One compiled expression fetching every graph input from the call's locals ``L``,
    the model module's globals ``G`` and the imported modules ``M``.

    Built from validated paths only (identifiers, ``repr`` of str/int keys, int dims), so
    the text compiled here can hold nothing but attribute, item and size lookups.
    """
    expressions = []
    for path in paths:
        if not gatherable(path):
            raise ValueError(f"bad input path {path}")
        (root, name), steps = path[0], path[1:]
        expressions.append(f"{_GATHER_ROOTS[root]}[{name!r}]{lookups(steps)}")
    source = f"lambda L: ({''.join(e + ', ' for e in expressions)})"
    namespace = {"__builtins__": {}, "G": scope, "M": sys.modules}
    return eval(compile(source, "<slotwise warm start inputs>", "eval"), namespace)
