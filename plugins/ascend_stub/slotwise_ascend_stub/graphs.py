"""Simulated NPU graphs: the stub's ``GraphAPI`` (``AscendStubPlatform.get_graph_api()``).

slotwise keeps the static-graph contract (warm-ups, capture per size, input-address
checks, one shared pool); a platform only says how to capture and replay one graph,
through a ``GraphAPI`` (``slotwise.compilation.graph_api``).  A real vendor wraps
its SDK's graph object here.  The stub "captures" by remembering the work; a
replay recomputes it from the captured input tensors and writes into the captured
output tensors, which is exactly what a device graph lets a caller observe: new
data copied into a captured buffer is seen, a tensor elsewhere is not.  A replay
also runs under the forward context of the capture, as a device graph keeps what
the captured code read on the host (the attention metadata of that step).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from slotwise.plugin_api import ForwardContext, set_forward_context, try_get_forward_context


class StubNpuGraph:
    def __init__(self, api: StubNpuGraphAPI) -> None:
        self.api = api
        self.work: Callable[[], Any] | None = None
        self.outputs: Any = None
        self.context: ForwardContext | None = None

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        # A real SDK records kernels into the graph here instead of running them.
        self.api.captures.append({"pool": pool, "quiet": quiet})
        self.context = _frozen(try_get_forward_context())
        self.work = fn
        self.outputs = fn()
        return self.outputs

    def replay(self) -> None:
        assert self.work is not None, "replay before capture"
        self.api.replays += 1
        with _restored(self.context):
            fresh = pytree.tree_leaves(self.work())
        for captured, value in zip(pytree.tree_leaves(self.outputs), fresh, strict=True):
            if isinstance(captured, torch.Tensor):
                captured.copy_(value)  # results land where the graph wrote them at capture


def _frozen(context: ForwardContext | None) -> ForwardContext | None:
    """The context's values now: the same tensors (same addresses), host values fixed."""
    if context is None:
        return None
    return ForwardContext(
        copy.copy(context.attn_metadata),
        context.graph_mode,
        context.batch_descriptor,
        dict(context.extras),
    )


@contextlib.contextmanager
def _restored(context: ForwardContext | None) -> Iterator[None]:
    if context is None:  # nothing captured read a context
        yield
        return
    with set_forward_context(
        context.attn_metadata,
        graph_mode=context.graph_mode,
        batch_descriptor=context.batch_descriptor,
        **context.extras,
    ):
        yield


class StubNpuGraphAPI:
    """The graph API of the stub NPU; it also counts what it did, for tests and demos."""

    def __init__(self) -> None:
        self._pool = object()  # a real SDK returns its graph memory pool handle
        self.captures: list[dict[str, Any]] = []
        self.replays = 0
        self.weak_refs = 0

    def new_graph(self) -> StubNpuGraph:
        return StubNpuGraph(self)

    def pool(self) -> Any:
        return self._pool

    def weak_ref(self, outputs: Any) -> Any:
        # On a device, the pool keeps captured memory alive and a weak alias lets it be
        # reused; host memory has no such pool, so the stub keeps strong references.
        self.weak_refs += 1
        return outputs


#: One API (hence one pool) for every graph of the process.
stub_graph_api = StubNpuGraphAPI()
