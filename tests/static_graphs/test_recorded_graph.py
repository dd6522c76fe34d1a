"""``RecordedGraph``: a replay runs what the capture ran, on the captured tensors, like a
device graph; what a device graph refuses fails the capture, naming the op.

Oracles are torch eager on the same module and data (with the host values of the
capture, where a replay must have frozen them).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from slotwise.compilation import CompilationConfig, GraphMode, StaticGraphError, counters
from slotwise.compilation.static_graphs.dispatcher import GraphDispatcher
from slotwise.compilation.static_graphs.recorded_graph import RecordedGraphAPI, opaque_call
from slotwise.compilation.static_graphs.wrapper import StaticGraphWrapper
from slotwise.forward_context import BatchDescriptor, get_forward_context, set_forward_context
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel, attend
from slotwise.testing.triton_interpreter import (
    ON_GPU,
    helpers_interpreted,
    import_interpreted,
    interpreting,
)

TOKENS, HIDDEN, HEADS = 6, 16, 2


class Block(nn.Module):
    """Norm, linear, attention-like mixing with views, a custom op, ``out=`` and in-place
    ops, a Python float (``scale``) and a host int (``rows``) read while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.scale = 0.5
        self.rows = TOKENS

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)  # views of one output
        q, k, v = (t.reshape(TOKENS, HEADS, HIDDEN // HEADS).transpose(0, 1) for t in (q, k, v))
        probs = (q @ k.transpose(1, 2) * self.scale).softmax(dim=-1)
        mixed = (probs @ v).transpose(0, 1).reshape(TOKENS, HIDDEN)
        mixed = attend(mixed.contiguous(), x, x)  # a Python custom op
        out = torch.empty(TOKENS, HIDDEN)
        torch.add(x, self.proj(mixed), out=out)
        out[self.rows :].zero_()  # in place, on a view sliced with a host int
        out.mul_(2)
        return out, probs.amax(dim=-1)


@pytest.fixture
def block() -> Block:
    torch.manual_seed(0)
    return Block().eval()


def captured(fn: Callable[[], Any]) -> tuple[Any, Any]:
    graph = RecordedGraphAPI().new_graph()
    with torch.no_grad():
        return graph, graph.capture(fn, None, quiet=True)


def test_replays_of_new_data_in_the_input_buffer_match_eager(block):
    buffer = torch.randn(TOKENS, HIDDEN)
    graph, (out, peaks) = captured(lambda: block(buffer))
    addresses = (out.data_ptr(), peaks.data_ptr())
    for seed in range(3):
        new = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(seed))
        buffer.copy_(new)
        graph.replay()
        with torch.no_grad():
            expected_out, expected_peaks = block(new)
        torch.testing.assert_close(out, expected_out)
        torch.testing.assert_close(peaks, expected_peaks)
        assert (out.data_ptr(), peaks.data_ptr()) == addresses  # written in place


def test_host_values_read_at_capture_are_frozen(block):
    buffer = torch.randn(TOKENS, HIDDEN)
    as_captured = copy.deepcopy(block)
    graph, (out, _) = captured(lambda: block(buffer))
    block.scale, block.rows = 2.0, 2  # after capture: a device graph never sees these
    buffer.copy_(torch.randn(TOKENS, HIDDEN))
    graph.replay()
    with torch.no_grad():
        torch.testing.assert_close(out, as_captured(buffer)[0])
        assert not torch.allclose(out, block(buffer)[0])


def test_tensors_allocated_inside_are_reused_and_recomputed():
    x = torch.ones(4)

    def accumulate() -> torch.Tensor:
        total = torch.zeros(4)
        total += x
        return total

    graph, total = captured(accumulate)
    address = total.data_ptr()
    x.fill_(3.0)
    graph.replay()
    graph.replay()
    assert total.tolist() == [3.0] * 4  # zeros again at each replay, not accumulated
    assert total.data_ptr() == address


def test_a_graph_captured_in_inference_mode_replays_outside_it(block):
    with torch.inference_mode():
        buffer = torch.randn(TOKENS, HIDDEN)
        graph = RecordedGraphAPI().new_graph()
        out, _ = graph.capture(lambda: block(buffer), None, quiet=True)
        buffer.copy_(torch.randn(TOKENS, HIDDEN))
    graph.replay()  # what a runner's inference-mode step made is written outside it
    with torch.inference_mode():
        torch.testing.assert_close(out, block(buffer)[0])


#: What the capture refuses -> the name its error gives.
REFUSED: dict[str, tuple[Callable[[torch.Tensor], Any], str]] = {
    "item": (lambda x: x.sum().item(), "Tensor.item()"),
    "tolist": (lambda x: x.tolist(), "Tensor.tolist()"),
    "int": (lambda x: x[: int(x[0, 0].abs())], "int(tensor)"),
    "python if": (lambda x: x if x.sum() > 0 else -x, "bool(tensor)"),
    "nonzero": (lambda x: x.nonzero(), "aten.nonzero"),
    "masked_select": (lambda x: x.masked_select(x > 0), "aten.masked_select"),
    "unique": (lambda x: x.unique(), "aten._unique2"),
    "bool mask read": (lambda x: x[x > 0], "aten.index with a boolean mask"),
    "bool mask write": (lambda x: x.clone().__setitem__(x > 0, 0.0), "with a boolean mask"),
    "repeat_interleave": (
        lambda x: x.repeat_interleave(torch.ones(TOKENS, dtype=torch.long), dim=0),
        "aten.repeat_interleave with a tensor of repeats and no output_size",
    ),
    "torch.tensor": (lambda x: x + torch.tensor([1.0] * HIDDEN), "aten.lift_fresh"),
    "cpu": (lambda x: x.cpu(), "Tensor.cpu()"),
    "numpy": (lambda x: x.numpy(), "Tensor.numpy()"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_a_device_graph_refuses_fails_the_capture_naming_the_op(case):
    work, name = REFUSED[case]
    x = torch.randn(TOKENS, HIDDEN)
    graph = RecordedGraphAPI().new_graph()
    with pytest.raises(StaticGraphError, match="during a static-graph capture") as raised:
        graph.capture(lambda: work(torch.relu(x)), None, quiet=True)
    assert name in str(raised.value)


def scale_by_the_context(x: torch.Tensor, out: torch.Tensor, read_on_host: bool) -> None:
    """``out = x * scale``, the scale read from the forward context like attention metadata."""
    scale = get_forward_context().attn_metadata
    if read_on_host:
        scale = max(x.tolist()) * 0 + scale
    out.copy_(x * scale)


scaled_custom_op = torch.library.custom_op(
    "slotwise_recorded_graph_test::scaled", scale_by_the_context, mutates_args=("out",)
)
_library = torch.library.Library("slotwise_recorded_graph_test", "FRAGMENT")
_library.define("scaled_lib(Tensor x, Tensor(a!) out, bool read_on_host) -> ()")
_library.impl("scaled_lib", scale_by_the_context, "CompositeExplicitAutograd")
#: The two ways to write an op in Python, by how torch.library registers it.
PYTHON_OPS = {
    "custom_op": scaled_custom_op,
    "Library.impl": torch.ops.slotwise_recorded_graph_test.scaled_lib,
}


@pytest.mark.parametrize("op", PYTHON_OPS.values(), ids=PYTHON_OPS.keys())
def test_an_op_written_in_python_is_recorded_inside_running_its_python_once(op):
    x, out = torch.ones(3), torch.empty(3)
    graph = RecordedGraphAPI().new_graph()
    with set_forward_context(2.0):
        graph.capture(lambda: op(x, out, False), None, quiet=True)
    x.fill_(5.0)
    with set_forward_context(100.0):
        graph.replay()
    assert out.tolist() == [10.0] * 3  # the new data, the scale of the capture


@pytest.mark.parametrize("op", PYTHON_OPS.values(), ids=PYTHON_OPS.keys())
def test_a_host_read_inside_an_op_written_in_python_is_refused(op):
    x, out = torch.ones(3), torch.empty(3)
    graph = RecordedGraphAPI().new_graph()
    with (
        set_forward_context(2.0),
        pytest.raises(StaticGraphError, match=r"Tensor\.tolist\(\) during a static-graph"),
    ):
        graph.capture(lambda: op(x, out, True), None, quiet=True)


def test_a_copy_from_a_device_to_the_host_is_refused():
    on_device = torch.empty(4, device="meta")  # the one non-CPU device of a CPU-only build
    graph = RecordedGraphAPI().new_graph()
    with pytest.raises(StaticGraphError, match="aten._to_copy from meta to the host"):
        graph.capture(lambda: on_device.to("cpu"), None, quiet=True)


def test_a_failed_capture_leaves_no_graph_and_no_recording():
    x = torch.randn(4)
    api = RecordedGraphAPI()
    graph = api.new_graph()
    with pytest.raises(StaticGraphError, match="Tensor.item()"):
        graph.capture(lambda: (x * 2).sum().item(), None, quiet=True)
    with pytest.raises(StaticGraphError, match=r"replay\(\) before a successful capture"):
        graph.replay()
    assert api.replays == 0
    assert (x * 2).sum().item() == pytest.approx(float(x.sum()) * 2)  # nothing still recording
    out = graph.capture(lambda: x * 2, None, quiet=True)  # the same graph captures anew
    x.fill_(1.0)
    graph.replay()
    assert out.tolist() == [2.0] * 4


def test_a_graph_is_captured_once_and_never_inside_another_capture():
    graph = RecordedGraphAPI().new_graph()
    graph.capture(lambda: torch.ones(1), None, quiet=True)
    with pytest.raises(StaticGraphError, match="already captured"):
        graph.capture(lambda: torch.ones(1), None, quiet=True)
    inner = RecordedGraphAPI().new_graph()
    with pytest.raises(StaticGraphError, match="inside another graph's capture"):
        RecordedGraphAPI().new_graph().capture(
            lambda: inner.capture(lambda: torch.ones(1), None, quiet=True), None, quiet=True
        )


def test_an_opaque_call_runs_again_at_each_replay():
    x = torch.randn(4)

    def through_numpy(t: torch.Tensor) -> torch.Tensor:  # work the dispatcher never sees
        return torch.from_numpy(t.numpy() * 3)

    graph, out = captured(lambda: opaque_call(through_numpy, x) + 1)
    x.copy_(torch.arange(4.0))
    graph.replay()
    assert out.tolist() == [1.0, 4.0, 7.0, 10.0]


def test_a_triton_launch_is_recorded_and_launched_again():
    # Triton calls its kernels directly: the dispatcher never sees them.
    if ON_GPU:
        pytest.skip("on a GPU triton compiles for the device; test_cuda_graphs covers it")
    pytest.importorskip("numpy", reason="Triton's interpreter needs numpy")
    if not helpers_interpreted():
        pytest.fail(
            "triton.language was imported before slotwise.testing.triton_interpreter set it up"
        )
    (kernel,) = import_interpreted("recorded_triton_kernel")
    x, out = torch.randn(3, 8), torch.empty(3, 8)
    graph = RecordedGraphAPI().new_graph()
    with interpreting():
        graph.capture(lambda: kernel.double_plus_one(x, out), None, quiet=True)
        x.copy_(torch.randn(3, 8))
        graph.replay()
    torch.testing.assert_close(out, 2 * x + 1)


class RebindingGraph:
    """Replays by computing new tensors and keeping them, not by writing the captured ones."""

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        self.fn = fn
        self.outputs = fn()
        return self.outputs

    def replay(self) -> None:
        self.outputs = self.fn()


class RebindingGraphAPI:
    def new_graph(self) -> RebindingGraph:
        return RebindingGraph()

    def pool(self) -> Any:
        return None

    def weak_ref(self, outputs: Any) -> Any:
        return outputs


def test_a_replay_that_rebinds_its_outputs_is_reported_as_such():
    config = CompilationConfig(capture_sizes=[2], graph_mode="PIECEWISE", graph_warmups=1)
    wrapper = StaticGraphWrapper(
        lambda x: x * 2, config, runtime_mode=GraphMode.PIECEWISE, graph_api=RebindingGraphAPI()
    )
    buffer = torch.randn(2, 4)
    with set_forward_context(
        None, graph_mode="PIECEWISE", batch_descriptor=BatchDescriptor(num_tokens=2)
    ):
        wrapper(buffer)  # warm-up
        with pytest.raises(StaticGraphError) as raised:
            wrapper(buffer)  # capture, and the replay right after it
    assert str(raised.value) == (
        "piece 0 of 1, capture size 2: replay() of RebindingGraphAPI did not write into the "
        "tensors capture() returned (every captured output still holds what slotwise wrote "
        "there before the replay); a replay must write its results in place into the "
        "captured outputs, not into new tensors"
    )


def test_the_check_after_capture_keeps_outputs_a_replay_never_writes():
    config = CompilationConfig(capture_sizes=[2], graph_mode="PIECEWISE", graph_warmups=0)
    constant = torch.full((2, 4), 7.0)  # returned as is: no replay writes it
    wrapper = StaticGraphWrapper(
        lambda x: (x * 2, constant),
        config,
        runtime_mode=GraphMode.PIECEWISE,
        graph_api=RecordedGraphAPI(),
    )
    buffer = torch.ones(2, 4)
    with set_forward_context(
        None, graph_mode="PIECEWISE", batch_descriptor=BatchDescriptor(num_tokens=2)
    ):
        doubled, returned = wrapper(buffer)  # capture, then the checked replay
    assert doubled.tolist() == [[2.0] * 4] * 2
    assert returned is constant
    assert constant.tolist() == [[7.0] * 4] * 2


def inductor_style_partition(args: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Called as Inductor calls a partition on a GPU: one list of inputs, emptied on
    entry (the partition owns them); an output may share an input's memory."""
    (x,) = args
    args.clear()
    return x * 2, x[0]


def partition_wrapper() -> StaticGraphWrapper:
    config = CompilationConfig(capture_sizes=[2], graph_mode="PIECEWISE", graph_warmups=1)
    return StaticGraphWrapper(
        inductor_style_partition,
        config,
        runtime_mode=GraphMode.PIECEWISE,
        graph_api=RecordedGraphAPI(),
        piece_index=1,
        num_pieces=3,
    )


def test_a_partition_with_an_output_in_its_input_replays_the_eager_result():
    """The check after capture marks outputs; one in an input's memory must be left
    alone, or the replay computes from the marker (a GPU gave wrong numbers this way)."""
    wrapper = partition_wrapper()
    buffer = torch.empty(2, 4)  # what the previous partition writes, at a fixed address
    with set_forward_context(
        None, graph_mode="PIECEWISE", batch_descriptor=BatchDescriptor(num_tokens=2)
    ):
        for seed in range(4):  # warm-up, capture and its checked replay, two replays
            fresh = torch.randn(2, 4, generator=torch.Generator().manual_seed(seed))
            buffer.copy_(fresh)
            doubled, first_row = wrapper([buffer])
            torch.testing.assert_close(doubled, fresh * 2)
            torch.testing.assert_close(first_row, fresh[0])
    assert wrapper.entries[2].graph is not None


def test_a_partition_input_that_moved_is_an_error_naming_it():
    wrapper = partition_wrapper()
    buffer = torch.ones(2, 4)
    with set_forward_context(
        None, graph_mode="PIECEWISE", batch_descriptor=BatchDescriptor(num_tokens=2)
    ):
        wrapper([buffer])  # warm-up
        wrapper([buffer])  # capture
        with pytest.raises(StaticGraphError, match=r"piece 1 of 3, capture size 2: input 0 "):
            wrapper([torch.ones(2, 4)])


@pytest.mark.slow
@pytest.mark.parametrize("graph_mode, graphs", [("FULL", 1), ("PIECEWISE", 3)])
def test_inductor_compiled_pieces_replay_on_recorded_graphs(graph_api, graph_mode, graphs):
    # Inductor's kernels never reach the dispatcher; the pieces run as opaque steps.
    config = CompilationConfig(
        level=3,
        backend="inductor",
        splitting_ops=TOY_SPLITTING_OPS,
        capture_sizes=[2],
        graph_mode=graph_mode,
        disable_cache=True,
    )
    torch.manual_seed(0)
    model = SillyModel(compilation_config=config)
    torch.manual_seed(0)
    reference = SillyModel(compilation_config=CompilationConfig(level=0))
    buffer = torch.empty(2, 8)
    dispatcher = GraphDispatcher.for_model(model)
    with counters.expect(num_graphs_captured=graphs):
        for seed in range(4):  # warm-up, capture, two replays
            buffer.copy_(torch.randn(2, 8, generator=torch.Generator().manual_seed(seed)))
            with dispatcher.step(2):
                torch.testing.assert_close(model(buffer), reference(buffer))
