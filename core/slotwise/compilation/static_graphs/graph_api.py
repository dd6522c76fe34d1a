"""``GraphAPI``: what a platform implements to have static graphs (CUDA graphs, NPU graphs).

A platform returns one from ``Platform.get_graph_api()``; slotwise's wrappers run the
static-graph contract on top of it, so a vendor writes only these few methods (see
``slotwise_cuda.graph_api`` and ``recorded_graph.RecordedGraphAPI``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class StaticGraph(Protocol):
    """One recorded sequence of device work, replayable on the addresses it recorded."""

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        """Record ``fn()`` into this graph, allocating from ``pool``; return what ``fn`` returned.

        The returned tensors live in graph-owned memory: they are the graph's outputs,
        and every ``replay()`` writes its results into exactly these tensors.  Their
        values after capture do not matter (a CUDA graph capture computes nothing):
        slotwise replays once right after capturing.  ``quiet`` skips the garbage
        collection and cache emptying a capture normally starts with; slotwise sets it
        for every piece after the first of a size, as doing it per piece is slow.
        """
        ...

    def replay(self) -> None:
        """Run the recorded work again: read the inputs at the addresses seen during
        capture and write the results, in place, into the tensors ``capture`` returned.

        Nothing is returned: slotwise hands on the tensors ``capture`` returned, so results
        written anywhere else are lost.  slotwise checks this on the replay right after
        each capture and raises ``StaticGraphError`` naming the GraphAPI when it fails."""
        ...


class GraphAPI(Protocol):
    """A platform's static graphs; one object per process (``Platform.get_graph_api()``)."""

    def new_graph(self) -> StaticGraph:
        """A new graph, empty until its ``capture``."""
        ...

    def pool(self) -> Any:
        """The memory pool every graph captures into, passed to ``StaticGraph.capture``.

        The same pool on every call, so the graphs of a model's pieces share memory.
        """
        ...

    def weak_ref(self, outputs: Any) -> Any:
        """``outputs`` with each tensor swapped for an alias that does not keep its memory
        alive (``weak_ref_tensors`` does this for a torch caching allocator).

        slotwise applies it to the last piece's captured outputs, so the pool may reuse
        that memory for the next graph; a platform without such a pool may return
        ``outputs`` unchanged.
        """
        ...


def weak_ref_tensors(outputs: Any) -> Any:
    """Aliases of the tensors in ``outputs`` that do not keep their memory alive, so the
    pool may reuse it; consume an output before the next replay of the same graph."""
    import torch
    from torch.utils import _pytree as pytree

    def alias(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        storage = torch._C._construct_storage_from_data_pointer(
            value.untyped_storage().data_ptr(), value.device, value.untyped_storage().nbytes()
        )
        weak = torch.empty(0, dtype=value.dtype, device=value.device)
        return weak.set_(storage, value.storage_offset(), value.shape, value.stride())

    return pytree.tree_map(alias, outputs)
