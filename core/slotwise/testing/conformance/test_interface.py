"""Check ``interface``: the platform class has the documented attributes, types and signatures.

slotwise reads these attributes without checking them at every use, and calls the
methods with keyword arguments that may grow over releases: a wrong type or a
method without ``**kwargs`` breaks a user far from the plugin's code.
"""

from __future__ import annotations

import inspect
from typing import Any

from slotwise.compilation.config import CompilationConfig, ConfigError
from slotwise.testing.conformance import target

#: Class attributes every platform sets, with the type slotwise relies on.
ATTRIBUTE_TYPES: dict[str, type] = {
    "name": str,
    "device_type": str,
    "dist_backend": str,
    "device_control_env_var": str,
    "default_compile_backend": str,
    "custom_op_key": str,
}

#: Values ``custom_op_key`` may take: the ``CustomOp.forward_<key>`` methods that exist.
CUSTOM_OP_KEYS = ("native", "cpu", "cuda", "oot")

#: What slotwise calls on the object ``get_graph_api()`` returns.
GRAPH_API_METHODS = ("new_graph", "pool", "weak_ref")

#: Methods slotwise calls with keyword arguments; each must accept unknown ones.
INTERFACE_METHODS = (
    "device_count",
    "get_device_name",
    "get_device_capability",
    "device_identity",
    "total_memory",
    "current_memory_usage",
    "set_device",
    "synchronize",
    "seed_everything",
    "get_attention_backend_cls",
    "get_communicator_cls",
    "get_graph_api",
    "get_piecewise_backend_cls",
    "advise_resident_memory",
    "check_and_update_config",
)


def test_class_attributes_have_the_documented_types() -> None:
    platform = target.platform()
    problems = []
    for attribute, expected in ATTRIBUTE_TYPES.items():
        value = getattr(platform, attribute, None)
        if type(value) is not expected:
            problems.append(f"{attribute} is {value!r}, expected a {expected.__name__}")
    if isinstance(platform.name, str) and platform.name != target.platform_name():
        problems.append(
            f"name is {platform.name!r}, but the PlatformSpec registers {target.platform_name()!r}"
        )
    if isinstance(platform.device_type, str) and not platform.device_type:
        problems.append("device_type is empty; set the torch device type ('cpu', 'cuda', 'npu')")
    if platform.custom_op_key not in CUSTOM_OP_KEYS:
        problems.append(
            f"custom_op_key is {platform.custom_op_key!r}, "
            f"expected one of {', '.join(CUSTOM_OP_KEYS)}"
        )
    if isinstance(platform.default_compile_backend, str):
        try:
            CompilationConfig(backend=platform.default_compile_backend)
        except ConfigError as exc:
            problems.append(f"default_compile_backend is not a valid compile backend: {exc}")
    if problems:
        target.fail("; ".join(problems))


def test_graph_hooks_answer_with_what_slotwise_builds_on() -> None:
    from slotwise.compilation.splitting.piecewise_backend import AbstractPiecewiseBackend

    platform = target.platform()
    problems = []
    graph_api = platform.get_graph_api()
    if graph_api is not None:
        missing = [m for m in GRAPH_API_METHODS if not callable(getattr(graph_api, m, None))]
        if missing:
            problems.append(
                f"get_graph_api() returned {graph_api!r}, which lacks {', '.join(missing)}(); "
                "return None or a slotwise.compilation.static_graphs.graph_api.GraphAPI"
            )
    cls = platform.get_piecewise_backend_cls()
    if cls is not None and not (
        isinstance(cls, type) and issubclass(cls, AbstractPiecewiseBackend)
    ):
        problems.append(
            f"get_piecewise_backend_cls() returned {cls!r}; return None (slotwise's backend) "
            "or a subclass of slotwise.compilation.AbstractPiecewiseBackend"
        )
    if problems:
        target.fail("; ".join(problems))


def test_device_count_is_a_positive_int() -> None:
    count = target.platform().device_count(future_kwarg=1)
    if type(count) is not int or count < 1:
        target.fail(
            f"device_count() returned {count!r}; a selected platform must see at least one "
            "device (its probe said it is available)"
        )


def test_device_identity_is_the_same_dict_of_strings_every_time() -> None:
    """slotwise keys its compile caches on it: anything but a dict of strings fails every
    compile, and an answer that changes from call to call never finds its cache again."""
    platform = target.platform()
    first, second = platform.device_identity(future_kwarg=1), platform.device_identity()
    if not isinstance(first, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in first.items()
    ):
        target.fail(
            f"device_identity() returned {first!r:.200}; return a dict of strings, e.g. "
            "{**super().device_identity(), 'name': ..., 'driver': ...}"
        )
    if second != first:
        target.fail(
            f"device_identity() changed between two calls ({first!r:.200}, then "
            f"{second!r:.200}); describe the device, not the moment"
        )


def test_methods_accept_unknown_keyword_arguments() -> None:
    platform = target.platform()
    rigid = []
    for method in INTERFACE_METHODS:
        parameters = inspect.signature(getattr(platform, method)).parameters.values()
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            owner = _defining_class(type(platform), method)
            rigid.append(f"{owner}.{method}")
    if rigid:
        target.fail(
            f"{', '.join(rigid)} must accept unknown keyword arguments (**kwargs), so that "
            "slotwise can pass new requirements without breaking the plugin"
        )


def _is_capability(value: Any) -> bool:
    return value is None or (
        isinstance(value, tuple) and len(value) == 2 and all(type(v) is int for v in value)
    )


#: The device queries: (method, valid answer, what is expected, whether a platform must
#: implement it), as docs/plugin-authors.md lists them.
DEVICE_QUERIES: list[tuple[str, Any, str, bool]] = [
    ("get_device_name", lambda v: isinstance(v, str) and v, "a non-empty str", True),
    ("get_device_capability", _is_capability, "None or a (major, minor) tuple of ints", True),
    ("total_memory", lambda v: type(v) is int and v > 0, "a positive int (bytes)", True),
    (
        "current_memory_usage",
        lambda v: type(v) is int and v >= 0,
        "an int >= 0 (bytes)",
        False,  # for `slotwise env` and capture reports only
    ),
]


def test_device_queries_answer_with_the_documented_types() -> None:
    """Each query, on the first and the last visible device, answers with what callers
    format and compare; only an optional one may raise NotImplementedError."""
    platform = target.platform()
    count = platform.device_count()
    devices = sorted({0, count - 1}) if type(count) is int and count >= 1 else [0]
    problems = []
    for method, valid, expected, required in DEVICE_QUERIES:
        for device in devices:
            call = f"{method}({device})"
            try:
                with target.calling(call):
                    value = getattr(platform, method)(device)
            except NotImplementedError as exc:
                if required:
                    problems.append(f"{call} raised NotImplementedError ({exc}); implement it")
                break
            except Exception as exc:  # noqa: BLE001 - reported with the query that raised it
                problems.append(f"{call} raised {type(exc).__name__}: {exc}")
                continue
            if not valid(value):
                problems.append(f"{call} returned {value!r}, expected {expected}")
    if problems:
        target.fail("; ".join(problems))


def test_advise_resident_memory_keeps_addresses_and_values() -> None:
    """Compiled code and captured graphs hold the weights' and the KV cache's addresses,
    so whatever the platform does to their memory must leave addresses and values."""
    import torch

    platform = target.platform()
    generator = torch.Generator().manual_seed(0)
    # A tensor of several (huge) pages, one smaller than a base page, and a view of a
    # storage that starts mid-page: the shapes a model's weights and caches come in.
    values = [torch.randn(3 << 18, generator=generator), torch.randn(37, generator=generator)]
    tensors = [value.to(platform.device_type) for value in values]
    tensors.append(tensors[0][1004:].view(-1, 7))
    addresses = [tensor.data_ptr() for tensor in tensors]
    platform.advise_resident_memory(tensors, future_kwarg=1)
    problems = []
    if [tensor.data_ptr() for tensor in tensors] != addresses:
        problems.append("moved a tensor to another address")
    if not all(torch.equal(t.cpu(), v) for t, v in zip(tensors, values, strict=False)):
        problems.append("changed a tensor's values")
    if tensors[2].shape != values[0][1004:].view(-1, 7).shape:
        problems.append("changed a view's shape")
    if problems:
        target.fail(
            f"advise_resident_memory() {' and '.join(problems)}; it may change how memory "
            "is mapped (huge pages), never a tensor's address, values or layout"
        )


def _defining_class(cls: type, method: str) -> str:
    for klass in cls.__mro__:
        if method in vars(klass):
            return klass.__name__
    return cls.__name__
