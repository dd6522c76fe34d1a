"""Simulated NPU graphs: the stub's ``GraphAPI`` (``AscendStubPlatform.get_graph_api()``).

slotwise keeps the static-graph contract (warm-ups, capture per size, input-address
checks, one shared pool); a platform only says how to capture and replay one graph,
through a ``GraphAPI`` (``slotwise.compilation.static_graphs.graph_api``).  A real vendor wraps its
SDK's graph object here.  The stub has no graph SDK, so it uses slotwise's
``RecordedGraphAPI``: a capture records the torch ops it runs and a replay runs exactly
those ops again on the captured tensors, so the stub accepts and refuses what a device
graph does (host syncs, copies to the host and tensors built from Python values fail
the capture) and, like a device graph, replays the host values its capture read.
"""

from __future__ import annotations

from slotwise.plugin_api import RecordedGraphAPI


class StubNpuGraphAPI(RecordedGraphAPI):
    """The graph API of the stub NPU: recorded graphs, counting what they did
    (``captures``, ``replays``, ``weak_refs``) for tests and demos."""


#: One API (hence one pool) for every graph of the process.
stub_graph_api = StubNpuGraphAPI()
