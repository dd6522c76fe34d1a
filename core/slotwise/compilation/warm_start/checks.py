"""Checks: Dynamo's guards as tests a warm process runs before it reuses a trace.

A trace is only right for what Dynamo assumed while making it, and Dynamo writes every
assumption down as a guard, in its own terms (a source, an object's id, a C++ guard).
:func:`guard_checks` turns each guard into a check that pickles and means the same in
another process: a path to the guarded value (:mod:`slotwise.compilation.trace_paths`)
and what the trace assumed it is, as data (constants by type and exact ``repr``, objects
by qualified name, tensors by their metadata), or, for a guard on torch's process state,
that state. A guard no check expresses raises :class:`Unpersistable`. A warm process runs
every check with :func:`failed_check` before it uses the saved trace.
"""

from __future__ import annotations

import enum
import functools
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from slotwise.compilation.trace_paths import Path, Unpersistable, path_of, path_resolver

# (what the check tests, Dynamo's name of the guarded value for logs, path or None for
# process state, the value the trace assumed)
Check = tuple[str, str, Path | None, Any]
# Types whose ``repr`` is their exact value: a constant of one is compared by that text.
_EXACT_REPR = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    range,
    slice,
)


# -- the cold side: a check for every guard ------------------------------------------------


def guard_checks(guards: Sequence[Any], trace: Any) -> list[Check]:
    """A check for every guard Dynamo made for the trace (``GuardFilterEntry``s)."""
    checks: dict[str, Check] = {}
    for entry in guards:
        kind = entry.guard_type
        if kind in _STATE_GUARDS:
            found = _STATE_GUARDS[kind](trace)
        elif kind == "SHAPE_ENV":
            _check_no_shape_guards(trace)
            continue
        else:
            found = _source_check(entry, trace)
        checks.setdefault(repr(found), found)
    return list(checks.values())


def _source_check(entry: Any, trace: Any) -> Check:
    """The check for a guard on one value the trace read (``entry.name``)."""
    kind, name, value, guard = entry.guard_type, entry.name, entry.value, entry.orig_guard
    if not entry.has_value:
        raise Unpersistable(f"Dynamo guard {kind} on {name} has no value to record")
    options = guard.create_fn.keywords if isinstance(guard.create_fn, functools.partial) else {}
    path = path_of(guard.originating_source, trace)
    if kind in ("CONSTANT_MATCH", "EQUALS_MATCH", "BOOL_MATCH", "NONE_MATCH"):
        if isinstance(value, types.CodeType):  # Dynamo matches code objects by identity
            return ("identity", name, path, _identity(value))
        return ("constant", name, path, _constant(value))
    if kind == "CONSTANT_SUBCLASS_MATCH":
        return ("constant_base", name, path, _constant_base(value))
    if kind == "TYPE_MATCH":
        return ("type", name, path, _qualified(type(value)))
    if kind in _IDENTITY_GUARDS:
        return ("identity", name, path, _identity(value))
    if kind in ("SEQUENCE_LENGTH", "EMPTY_NN_MODULE_HOOKS_DICT"):
        return ("length", name, path, [_qualified(type(value)), len(value)])
    if kind in ("DICT_KEYS_MATCH", "MAPPING_KEYS_CHECK"):
        return ("keys", name, path, [_qualified(type(value)), _keys(value)])
    if kind == "NOT_PRESENT_IN_GENERIC_DICT" and isinstance(options.get("attr"), str):
        return ("not_in_instance_dict", name, path, options["attr"])
    if kind == "HASATTR" and isinstance(options.get("attr"), str):
        return ("hasattr", name, path, [options["attr"], hasattr(value, options["attr"])])
    if kind in ("DICT_CONTAINS", "DICT_NOT_CONTAINS") and type(options.get("key")) in (str, int):
        return ("contains", name, path, [options["key"], options["key"] in value])
    if kind == "NOT_NONE_MATCH":
        return ("not_none", name, path, None)
    if kind == "TENSOR_MATCH":
        return ("tensor", name, path, _tensor_expectation(value, guard.originating_source, trace))
    if kind == "DUPLICATE_INPUT" and "source_b" in options:
        return ("same_object", name, path, path_of(options["source_b"], trace))
    raise Unpersistable(f"Dynamo guard {kind} on {name} has no warm-start check")


_IDENTITY_GUARDS = frozenset(
    {"ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH", "BUILTIN_MATCH", "CLOSURE_MATCH"}
)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _constant(value: Any) -> Any:
    """A value the trace baked in, as comparable data: type and exact ``repr`` (so 1,
    1.0 and True differ, as do 0.0 and -0.0), containers item by item."""
    kind = type(value)
    if kind in _EXACT_REPR:
        return [kind.__name__, repr(value)]
    if kind in (tuple, list, torch.Size):
        return [kind.__name__, [_constant(item) for item in value]]
    if kind in (set, frozenset):
        return [kind.__name__, sorted((_constant(item) for item in value), key=repr)]
    if isinstance(value, enum.Enum):
        return ["enum", _qualified(kind), value.name]
    if isinstance(value, type):
        return ["class", _qualified(value)]
    raise Unpersistable(f"the trace baked in a {kind.__qualname__}, which it cannot compare")


_CONSTANT_BASES = {"int": int, "float": float, "str": str}


def _constant_base(value: Any) -> list[Any]:
    """Dynamo's check of an int/float/str subclass: its plain value."""
    for name, base in _CONSTANT_BASES.items():
        if isinstance(value, base):
            return [name, _constant(base(value))]
    raise Unpersistable(f"constant of type {type(value).__qualname__}")


def _keys(mapping: Any) -> list[Any]:
    keys = dict.keys(mapping) if isinstance(mapping, dict) else mapping.keys()
    return [_constant(key) for key in keys]


def _identity(value: Any) -> list[Any]:
    """What an identity guard (``x is obj``) pinned, in terms valid in another process:
    the module, class or function by its qualified name (and code location)."""
    if value is None or value is Ellipsis or isinstance(value, bool):
        return ["constant", repr(value)]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, type):
        return ["class", _qualified(value)]
    if isinstance(value, enum.Enum):
        return ["enum", _qualified(type(value)), value.name]
    if isinstance(value, types.FunctionType):
        return ["function", value.__module__, *_code_identity(value.__code__)]
    if isinstance(value, types.CodeType):
        return ["code", *_code_identity(value)]
    if isinstance(value, types.BuiltinFunctionType) and (
        value.__self__ is None or isinstance(value.__self__, types.ModuleType)
    ):
        return ["builtin", getattr(value.__self__, "__name__", None), value.__qualname__]
    if isinstance(value, torch._ops.OpOverloadPacket):
        return ["operator", value._qualified_op_name]
    if isinstance(value, torch._ops.OpOverload):
        return ["operator", str(value)]
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return ["descriptor", _qualified(value.__objclass__), value.__name__]
    raise Unpersistable(
        f"the trace depends on which {type(value).__qualname__} object it got, which "
        "another process cannot tell"
    )


def _code_identity(code: types.CodeType) -> list[Any]:
    return [code.co_qualname, code.co_filename, code.co_firstlineno]


def _tensor_expectation(tensor: Any, source: Any, trace: Any) -> dict[str, Any]:
    """Dynamo's tensor guard: type, dtype, device, requires_grad, dispatch keys, and the
    sizes and strides that are static (None where the trace is dynamic)."""
    from torch._dynamo.guards import convert_to_concrete_values

    metadata = trace.input_source_to_sizes_strides.get(source)
    if not isinstance(tensor, torch.Tensor) or metadata is None:
        raise Unpersistable(f"tensor guard on {source.name} without recorded sizes")
    return {
        **_tensor_facts(tensor),
        "size": convert_to_concrete_values(metadata["size"]),
        "stride": convert_to_concrete_values(metadata["stride"]),
    }


def _tensor_facts(tensor: torch.Tensor) -> dict[str, Any]:
    return {
        "type": _qualified(type(tensor)),
        "dtype": str(tensor.dtype),
        "device": str(tensor.device),
        "requires_grad": tensor.requires_grad,
        "dispatch_keys": str(torch._C._dispatch_keys(tensor)),
    }


def _check_no_shape_guards(trace: Any) -> None:
    """Dynamic dimensions are unbacked and strict, so a trace holds no size guard: one
    that does is specialised in a way no path check expresses."""
    shape_env = trace.shape_env
    if shape_env.guards or shape_env.backed_var_to_val:
        raise Unpersistable("the trace holds guards on symbolic sizes")


def _global_state_check(trace: Any) -> Check:
    # Grad mode, autocast, default dtype, deterministic algorithms, TF32, thread count.
    state = trace.global_state_guard.__getstate__()
    return ("global_state", "torch global state", None, state)


def _function_modes_check(trace: Any) -> Check:
    from torch.utils._device import DeviceContext

    modes = trace.torch_function_mode_stack
    if any(type(mode) is not DeviceContext for mode in modes):
        raise Unpersistable("traced under a torch function mode, whose state is unknown")
    return ("function_modes", "torch function modes", None, [_qualified(type(m)) for m in modes])


def _saved_tensors_hooks_check(trace: Any) -> Check:
    if _top_saved_tensors_hooks() is not None:
        raise Unpersistable("traced under autograd saved-tensors hooks")
    return ("no_saved_tensors_hooks", "autograd saved-tensors hooks", None, None)


def _functorch_check(trace: Any) -> Check:
    if trace.functorch_layers:
        raise Unpersistable("traced inside a functorch transform (vmap, grad)")
    return ("no_functorch_transform", "functorch transforms", None, None)


_STATE_GUARDS: dict[str, Callable[[Any], Check]] = {
    # Dynamo: grad mode, deterministic algorithms and FSDP state are in the global state.
    "GLOBAL_STATE": _global_state_check,
    "GRAD_MODE": _global_state_check,
    "DETERMINISTIC_ALGORITHMS": _global_state_check,
    "FSDP_TRAINING_STATE": _global_state_check,
    "DEFAULT_DEVICE": lambda trace: (
        "default_device",
        "torch default device (torch.set_default_device)",
        None,
        repr(trace.current_device),
    ),
    "DUAL_LEVEL": lambda trace: ("dual_level", "forward AD level", None, trace.dual_level),
    "TORCH_FUNCTION_STATE": _function_modes_check,
    "AUTOGRAD_SAVED_TENSORS_HOOKS": _saved_tensors_hooks_check,
    "FUNCTORCH_STACK_MATCH": _functorch_check,
}


def _top_saved_tensors_hooks() -> Any:
    return torch._C._autograd._top_saved_tensors_default_hooks(True)


# -- the warm side: running the checks ----------------------------------------------------


def failed_check(checks: list[Check], arguments: dict[str, Any], scope: dict[str, Any]) -> str:
    """The first check that does not hold now, described, or ""."""
    resolve = path_resolver(arguments, scope)
    for kind, name, path, expected in checks:
        try:
            value = None if path is None else resolve(path)
            mismatch = _MISMATCH[kind](value, expected, resolve)
        except Exception as err:  # noqa: BLE001 - a value that cannot be read is a miss
            mismatch = f"cannot be read ({type(err).__name__}: {err})"
        if mismatch:
            return f"{name or kind}: {mismatch}"
    return ""


def _differs(now: Any, expected: Any) -> str:
    return "" if now == expected else f"is {now!r}, the trace assumed {expected!r}"


def _constant_now(value: Any) -> Any:
    try:
        return _constant(value)
    except Unpersistable:
        return ["object", _qualified(type(value))]


def _tensor_mismatch(value: Any, expected: dict[str, Any]) -> str:
    if not isinstance(value, torch.Tensor):
        return f"is a {type(value).__qualname__}, the trace assumed a tensor"
    if value.dim() != len(expected["size"]):
        return f"has {value.dim()} dimensions, the trace assumed {len(expected['size'])}"
    now = {
        **_tensor_facts(value),
        "size": _where_static(value.size(), expected["size"]),
        "stride": _where_static(value.stride(), expected["stride"]),
    }
    return _differs(now, expected)


def _where_static(actual: Sequence[int], expected: list[int | None]) -> list[int | None]:
    """``actual`` with the dimensions the trace keeps dynamic (None) left out."""
    return [a if e is not None else None for a, e in zip(actual, expected, strict=True)]


def _global_state_mismatch(expected: str) -> str:
    guard = torch._C._dynamo.guards.GlobalStateGuard()
    guard.__setstate__(expected)
    return "" if guard.check() else f"{guard.reason()} differs from the trace's"


_MISMATCH: dict[str, Callable[[Any, Any, Callable[[Path], Any]], str]] = {
    "constant": lambda value, expected, _: _differs(_constant_now(value), expected),
    "constant_base": lambda value, expected, _: _differs(
        [expected[0], _constant(_CONSTANT_BASES[expected[0]](value))]
        if isinstance(value, _CONSTANT_BASES[expected[0]])
        else _qualified(type(value)),
        expected,
    ),
    "type": lambda value, expected, _: _differs(_qualified(type(value)), expected),
    "identity": lambda value, expected, _: _differs(_identity_now(value), expected),
    "length": lambda value, expected, _: _differs([_qualified(type(value)), len(value)], expected),
    "keys": lambda value, expected, _: _differs([_qualified(type(value)), _keys(value)], expected),
    "not_in_instance_dict": lambda value, expected, _: (
        f"has {expected!r} in its __dict__" if expected in vars(value) else ""
    ),
    "hasattr": lambda value, expected, _: _differs(
        [expected[0], hasattr(value, expected[0])], expected
    ),
    "contains": lambda value, expected, _: _differs([expected[0], expected[0] in value], expected),
    "not_none": lambda value, expected, _: "is None" if value is None else "",
    "tensor": lambda value, expected, _: _tensor_mismatch(value, expected),
    "same_object": lambda value, expected, resolve: (
        "" if value is resolve(expected) else "is no longer the same object (untied weights?)"
    ),
    "global_state": lambda _, expected, __: _global_state_mismatch(expected),
    "default_device": lambda _, expected, __: _differs(_default_device(), expected),
    "dual_level": lambda _, expected, __: _differs(
        torch.autograd.forward_ad._current_level, expected
    ),
    "function_modes": lambda _, expected, __: _differs(
        [_qualified(type(mode)) for mode in torch.overrides._get_current_function_mode_stack()],
        expected,
    ),
    "no_saved_tensors_hooks": lambda _, __, ___: (
        "are set" if _top_saved_tensors_hooks() is not None else ""
    ),
    "no_functorch_transform": lambda _, __, ___: (
        "are active" if torch._C._functorch.peek_interpreter_stack() is not None else ""
    ),
}


def _default_device() -> str:
    import torch.utils._device as default_device

    return repr(default_device.CURRENT_DEVICE)


def _identity_now(value: Any) -> Any:
    try:
        return _identity(value)
    except Unpersistable:
        return ["object", _qualified(type(value))]


def aliased(inputs: tuple[Any, ...]) -> str:
    """Dynamo passes a tensor reached by two paths once (tied weights); a saved graph
    whose inputs are one tensor now would need another trace."""
    tensors = [value for value in inputs if isinstance(value, torch.Tensor)]
    if len({id(tensor) for tensor in tensors}) != len(tensors):
        return "two graph inputs are one tensor now (tied weights?)"
    return ""
