"""FX splitting at the splitting ops."""

from __future__ import annotations

import pytest
import torch
import torch.fx

from slotwise.compilation.splitting.fx_split import op_names, split_graph
from slotwise.testing.toy_models import toy_attention  # noqa: F401 - registers the op


def traced(fn) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(fn)


def back_to_back(x):
    a = torch.empty_like(x)
    b = torch.empty_like(x)
    torch.ops.slotwise_toy.attention.default(x, x, x, a)
    torch.ops.slotwise_toy.attention.default(a, a, a, b)
    return b + 1


def one_split(x):
    y = x * 2
    out = torch.empty_like(y)
    torch.ops.slotwise_toy.attention.default(y, y, y, out)
    return out - 1


@pytest.mark.parametrize(
    "names", [["slotwise_toy::attention"], ["slotwise_toy::attention.default"]]
)
def test_split_matches_op_with_or_without_overload(names):
    split, pieces = split_graph(traced(one_split), names)
    assert [p.is_splitting for p in pieces] == [False, True, False]
    x = torch.randn(3, 4)
    torch.testing.assert_close(split(x), one_split(x))


def test_other_overload_name_does_not_match():
    _, pieces = split_graph(traced(one_split), ["slotwise_toy::attention.other"])
    assert len(pieces) == 1


def test_consecutive_splitting_ops_share_one_piece_and_keep_their_order():
    split, pieces = split_graph(traced(back_to_back), ["slotwise_toy::attention"])
    splitting = [p for p in pieces if p.is_splitting]
    assert len(splitting) == 1 and len(pieces) == 3
    calls = [n for n in splitting[0].graph.graph.nodes if n.op == "call_function"]
    attention_calls = [n for n in calls if "attention" in str(n.target)]
    assert len(attention_calls) == 2
    x = torch.randn(2, 3)
    torch.testing.assert_close(split(x), back_to_back(x))


def test_op_names_of_packets_overloads_and_python_functions():
    packet = torch.ops.slotwise_toy.attention
    assert op_names(packet) == ("slotwise_toy::attention", "slotwise_toy::attention.default")
    assert op_names(packet.default) == op_names(packet)
    assert op_names(torch.add) == ()
