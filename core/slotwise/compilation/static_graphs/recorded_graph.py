"""Static graphs recorded from torch's dispatcher: ``RecordedGraph`` and ``RecordedGraphAPI``.

A device graph replays exactly the kernels its capture launched, with every host value
frozen; a ``RecordedGraph`` keeps that contract on any device by recording the ops the
dispatcher runs and replaying them on the same tensors, and refuses what a device graph
cannot capture with a ``StaticGraphError`` naming the op.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from slotwise.compilation.static_graphs.contract import StaticGraphError

logger = logging.getLogger(__name__)

aten = torch.ops.aten

#: Ops whose output size depends on the data, so the host must wait for the device to
#: read it back: op -> what to use instead.
_DATA_DEPENDENT_SIZE = {
    aten.nonzero.default: "torch.nonzero_static(x, size=...) or a mask with torch.where",
    aten.argwhere.default: "torch.nonzero_static(x, size=...) or a mask with torch.where",
    aten.masked_select.default: "torch.where(mask, x, 0) or x.masked_fill(~mask, 0)",
    aten._unique.default: "a fixed-size result (e.g. torch.bincount(x, minlength=n) > 0)",
    aten._unique2.default: "a fixed-size result (e.g. torch.bincount(x, minlength=n) > 0)",
    aten.unique_dim.default: "a fixed-size result computed with torch ops",
    aten.unique_consecutive.default: "a fixed-size result computed with torch ops",
    aten.bincount.default: "scatter_add_ into a tensor of fixed size",
    aten.equal.default: "(a == b).all() kept as a tensor",
    aten.is_nonzero.default: "torch.where on the tensor instead of a Python condition",
}
#: ``Tensor`` methods that hand tensor data to Python; most never reach the dispatcher
#: for CPU tensors (``tolist``, ``numpy``, ``cpu``), so they are caught by name.
_HOST_READS = {
    "item": "Tensor.item()",
    "tolist": "Tensor.tolist()",
    "numpy": "Tensor.numpy()",
    "__array__": "numpy.asarray(tensor)",
    "cpu": "Tensor.cpu()",
    "__bool__": "bool(tensor) (a Python `if`/`and`/`or` on a tensor)",
    "__int__": "int(tensor)",
    "__float__": "float(tensor)",
    "__index__": "a tensor used as a Python index",
    "__complex__": "complex(tensor)",
    "__format__": "formatting a tensor's value",
}
#: Allocations: a device graph allocates their memory once, from its pool, and a replay
#: reuses it; nothing to run again.
_ALLOCATIONS = {
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.empty_permuted.default,
}

_recording = threading.local()


def _active_capture() -> _Capture | None:
    """The capture in progress on this thread, if any."""
    return getattr(_recording, "active", None)


@dataclass(frozen=True)
class _Step:
    """One recorded op (or opaque call): run ``run(*args, **kwargs)`` again, then copy each
    new result into the captured tensor at the same place of the output."""

    run: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: (index among the output's leaves, the tensor the capture produced there).
    fresh_outputs: tuple[tuple[int, torch.Tensor], ...]
    #: A collective (``c10d``) op, whose results are complete only once its ``Work`` is waited on.
    returns_work: bool = False

    def replay(self) -> None:
        result = self.run(*self.args, **self.kwargs)
        if self.returns_work:
            _wait_for_work(result)
        if not self.fresh_outputs:
            return
        leaves = pytree.tree_leaves(result)
        for index, captured in self.fresh_outputs:
            if leaves[index] is not captured:
                captured.copy_(leaves[index])


def _returns_work(func: Any) -> bool:
    """Whether ``func`` is a collective that returns a ``c10d`` ``Work`` handle."""
    return any("c10d.Work" in str(ret.type) for ret in func._schema.returns)


def _wait_for_work(result: Any) -> None:
    """Wait for each ``Work`` handle in ``result``, as ``torch.distributed`` does after
    dispatching a collective (outside the dispatcher, so never recorded)."""
    import torch.distributed as dist

    for leaf in pytree.tree_leaves(result):
        if isinstance(leaf, torch.ScriptObject):
            dist.Work.unbox(leaf).wait()


def _refusal(op: str, problem: str, instead: str) -> StaticGraphError:
    return StaticGraphError(
        f"{op} during a static-graph capture: {problem}, which a device graph cannot "
        f"record; {instead}"
    )


def _host_sync(op: str) -> StaticGraphError:
    return _refusal(
        op,
        "it reads a tensor's value back to the host (a host sync)",
        "a replay runs no Python, so keep the value in a tensor and compute with torch ops, "
        "or read it before capture (e.g. from host-side metadata built outside the graph)",
    )


class _HostReadGuard(TorchFunctionMode):
    """Refuses the ``Tensor`` methods that give tensor data to Python, by their own names."""

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        name = getattr(func, "__name__", "")
        if name in _HOST_READS and _active_capture() is not None:
            if name == "cpu":
                raise _refusal(
                    "Tensor.cpu()",
                    "it copies device memory to the host",
                    "keep the data on the device, or copy it out after replay()",
                )
            raise _host_sync(_HOST_READS[name])
        return func(*args, **(kwargs or {}))


class _Recorder(TorchDispatchMode):
    """Runs and records every op the dispatcher sees; refuses the ones graphs cannot hold."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[_Step] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        _refuse_uncapturable(func, args, kwargs)
        python_kernel = _python_kernel(func, args)
        if python_kernel is not None:
            # An op written in Python: record the ops inside it, so its Python (which may
            # read the forward context) runs once, at capture, as it would on a device.
            # The guard is off while torch runs the op's call: put it back for the body.
            with self, _HostReadGuard():
                return func.redispatch(python_kernel, *args, **kwargs)
        result = func(*args, **kwargs)
        if func in _ALLOCATIONS:
            return result
        # c10d's collectives write into their tensors without saying so in their schemas.
        collective = _returns_work(func)
        mutates = collective or any(
            arg.alias_info is not None and arg.alias_info.is_write for arg in func._schema.arguments
        )
        fresh = _new_tensors(result, (args, kwargs))
        if mutates or fresh:  # a pure view or a metadata query leaves nothing to redo
            self.steps.append(_Step(func, tuple(args), kwargs, fresh, collective))
        return result


def _new_tensors(result: Any, inputs: Any) -> tuple[tuple[int, torch.Tensor], ...]:
    """The tensors of ``result`` (with their index among its leaves) in memory none of
    ``inputs`` uses: what a replay must copy into.  Decided by memory, not the schema,
    since ``reshape`` or ``to`` are declared as views yet copy when they must.
    """
    used = {
        leaf.untyped_storage().data_ptr()
        for leaf in pytree.tree_leaves(inputs)
        if isinstance(leaf, torch.Tensor)
    }
    return tuple(
        (index, leaf)
        for index, leaf in enumerate(pytree.tree_leaves(result))
        if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().data_ptr() not in used
    )


def _python_kernel(func: Any, args: Sequence[Any]) -> Any:
    """The dispatch key set that runs ``func``'s Python kernel for the tensors in ``args``
    (an op made with ``torch.library.custom_op`` or ``Library.impl``); None for aten ops
    and ops whose kernel is compiled code."""
    if func.namespace in ("aten", "prim", "prims"):
        return None
    device = next(
        (arg.device.type for arg in pytree.tree_leaves(args) if isinstance(arg, torch.Tensor)),
        None,
    )
    if device is None:
        return None
    backend = torch._C._dispatch_key_for_device(device)
    name = func._schema.name
    overload = "" if func._overloadname == "default" else f".{func._overloadname}"
    # torch.library keeps the keys of the kernels registered from Python in _impls,
    # "namespace/op[.overload]/DispatchKey": the one record that tells them from C++.
    registered = f"{func.namespace}/{name.split('::')[-1]}{overload}/"
    for key in (backend, "CompositeExplicitAutograd", "CompositeImplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            if registered + key not in torch.library._impls:
                return None  # compiled code: the dispatcher would not see inside it
            return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, backend))
    return None


def _refuse_uncapturable(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    name = f"aten.{func._schema.name.split('::')[-1]}" if func.namespace == "aten" else str(func)
    if func is aten._local_scalar_dense.default:
        raise _host_sync(
            "aten._local_scalar_dense (Tensor.item(), int(tensor), float(tensor), "
            "bool(tensor) or .tolist())"
        )
    if func in _DATA_DEPENDENT_SIZE:
        raise _refusal(
            name,
            "its output size depends on the data, so the host must read it back (a host sync)",
            f"use {_DATA_DEPENDENT_SIZE[func]}",
        )
    if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) or (
        func is aten._index_put_impl_.default
    ):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(
            isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
            for index in indices
        ):
            raise _refusal(
                f"{name} with a boolean mask (x[mask] or x[mask] = v)",
                "the number of selected elements is read back to the host (a host sync)",
                "use torch.where(mask, x, other) or x.masked_fill(mask, value)",
            )
    if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        raise _refusal(
            "aten.repeat_interleave with a tensor of repeats and no output_size",
            "the output size is the sum of the repeats, read back to the host (a host sync)",
            "pass output_size=... (known on the host before capture)",
        )
    # A 0-d tensor lifted from a Python scalar (``x[i] = 1.0``) is a kernel argument, frozen
    # like any scalar: a device graph takes it, so only tensors of data are refused.
    if func in (aten.lift_fresh.default, aten.lift_fresh_copy.default) and args[0].dim() > 0:
        raise _refusal(
            "aten.lift_fresh (torch.tensor(...), torch.as_tensor(...) or torch.from_numpy(...))",
            "it builds a tensor from Python or host data: a host-to-device copy",
            "build the tensor before capture and copy new values into it between replays, "
            "or compute it with torch ops (torch.arange, torch.full, ...)",
        )
    _refuse_device_to_host(func, name, args, kwargs)


def _refuse_device_to_host(
    func: Any, name: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    if func is aten._to_copy.default:
        source, target = args[0].device, kwargs.get("device")
    elif func is aten.copy_.default:
        target, source = args[0].device, args[1].device
    else:
        return
    if target is not None and torch.device(target).type == "cpu" and source.type != "cpu":
        raise _refusal(
            f"{name} from {source} to the host",
            "it copies device memory to the host (a host sync)",
            "keep the data on the device, or copy it out after replay()",
        )


@dataclass
class _Capture:
    """The recording in progress on this thread."""

    recorder: _Recorder

    def call_unrecorded(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``fn(*args, **kwargs)`` recorded as one step, not op by op."""
        _recording.active = None
        try:
            with _disable_current_modes():
                result = fn(*args, **kwargs)
        finally:
            _recording.active = self
        self.recorder.steps.append(_Step(fn, args, kwargs, _new_tensors(result, (args, kwargs))))
        return result


def opaque_call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; inside a ``RecordedGraph`` capture, recorded as one step that every
    replay calls again, for work the dispatcher never sees (an Inductor-compiled piece).
    ``fn`` runs again at each replay, so it must depend only on ``args``.
    """
    capture = _active_capture()
    if capture is None:
        return fn(*args)
    return capture.call_unrecorded(fn, args, {})


def through_recorder(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, called through ``opaque_call`` unless it is plain FX code (a ``GraphModule``
    or its ``forward``), whose ops the dispatcher sees and a recording keeps one by one."""
    owner = getattr(fn, "__self__", fn)
    if isinstance(owner, torch.fx.GraphModule):
        return fn
    return functools.partial(opaque_call, fn)


#: Triton's launchers: ``kernel[grid](...)`` ends in ``run`` of one of these classes.
_TRITON_LAUNCHERS = (
    ("triton.runtime.jit", "JITFunction"),
    ("triton.runtime.interpreter", "InterpretedFunction"),
)


class _TritonLaunches:
    """While any thread captures, Triton launches on a capturing thread are recorded as
    steps: Triton calls its kernels directly, so the dispatcher never sees them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.originals: list[tuple[type, Callable[..., Any]]] = []

    @contextlib.contextmanager
    def recorded(self) -> Iterator[None]:
        with self.lock:
            if self.users == 0:
                self._patch()
            self.users += 1
        try:
            yield
        finally:
            with self.lock:
                self.users -= 1
                if self.users == 0:
                    self._restore()

    def _patch(self) -> None:
        for cls in _launcher_classes():
            self.originals.append((cls, cls.run))
            cls.run = _recording_launch(cls.run)

    def _restore(self) -> None:
        for cls, run in self.originals:
            cls.run = run
        self.originals.clear()


def _launcher_classes() -> list[type]:
    """Triton's launcher classes, importing Triton if installed: a capture would import it
    anyway, and only an imported class can be patched in time."""
    if "triton" not in sys.modules and importlib.util.find_spec("triton") is None:
        return []
    classes = []
    for module_name, class_name in _TRITON_LAUNCHERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # e.g. the interpreter without numpy: it cannot launch either
            continue
        classes.append(getattr(module, class_name))
    return classes


def _recording_launch(launch: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(launch)
    def run(kernel: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        capture = _active_capture()
        if capture is None or warmup:
            return launch(kernel, *args, grid=grid, warmup=warmup, **kwargs)
        bound = functools.partial(launch, kernel, grid=grid, warmup=False)
        return capture.call_unrecorded(bound, args, kwargs)

    return run


_triton_launches = _TritonLaunches()


class RecordedGraph:
    """A static graph recorded from torch's dispatcher; see ``RecordedGraphAPI``."""

    def __init__(self, api: RecordedGraphAPI | None = None) -> None:
        self.api = api
        self.steps: list[_Step] | None = None
        self.inference = False

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        """Run ``fn()``, recording its ops; return its outputs.  A capture that raises
        leaves the graph empty; ``pool`` and ``quiet`` only serve the protocol."""
        if self.steps is not None:
            raise StaticGraphError(
                "RecordedGraph.capture() called on a graph that is already captured; "
                "a graph is captured once: take a new one from new_graph()"
            )
        if _active_capture() is not None:
            raise StaticGraphError(
                "RecordedGraph.capture() inside another graph's capture; capture graphs "
                "one after the other"
            )
        recorder = _Recorder()
        _recording.active = _Capture(recorder)
        try:
            with _triton_launches.recorded(), _HostReadGuard(), recorder:
                outputs = fn()
        finally:
            _recording.active = None
        self.steps = recorder.steps
        self.inference = torch.is_inference_mode_enabled()
        if self.api is not None:
            self.api.captures.append({"pool": pool, "quiet": quiet})
        logger.debug("recorded a static graph of %d steps", len(self.steps))
        return outputs

    def replay(self) -> None:
        """Run the recorded ops again on the captured tensors; results land in place."""
        if self.steps is None:
            raise StaticGraphError(
                "RecordedGraph.replay() before a successful capture(); capture the graph first"
            )
        if self.api is not None:
            self.api.replays += 1
        # No autograd, as on a device; a capture's inference tensors can only be written
        # in inference mode, whatever mode the caller replays in.
        with torch.inference_mode() if self.inference else torch.no_grad():
            for step in self.steps:
                step.replay()


class RecordedGraphAPI:
    """Static graphs simulated by recording torch ops: a ``GraphAPI`` for any device.

    A vendor returns one from ``Platform.get_graph_api()`` on a build without its device
    graph SDK (as the ``ascend_stub`` plugin does) and gets a real device graph's contract,
    checked: host values frozen at capture, new data copied into the captured inputs, and
    host syncs, copies to the host and tensors built from Python values refused.

    Aten ops are recorded one by one, Python-kernel ops through the ops inside them, other
    custom ops, Triton launches and c10d collectives whole.  Work that bypasses the
    dispatcher (Inductor code called directly) must go through ``opaque_call``.  It counts
    ``captures``, ``replays`` and ``weak_refs`` for tests.
    """

    def __init__(self) -> None:
        self._pool = object()  # host memory has no graph pool; a handle keeps the protocol
        self.captures: list[dict[str, Any]] = []
        self.replays = 0
        self.weak_refs = 0

    def new_graph(self) -> RecordedGraph:
        return RecordedGraph(self)

    def pool(self) -> Any:
        return self._pool

    def weak_ref(self, outputs: Any) -> Any:
        """``outputs`` unchanged: the recording holds them, and there is no pool."""
        self.weak_refs += 1
        return outputs
