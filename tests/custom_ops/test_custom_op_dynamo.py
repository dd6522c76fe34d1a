"""Dynamo traces models made of CustomOps in one graph, whichever implementation each
layer chose, and traces the chosen one (not forward_native behind the user's back).

``torch._dynamo`` is imported inside the tests, not at collection: it imports
``triton.language``, which slotwise.testing.triton_interpreter must import first, under
``TRITON_INTERPRET=1``, where there is no GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from custom_op_platforms import CpuOpsPlatform
from torch import nn

import slotwise.custom_op as custom_op_module
from slotwise.compilation import CompilationConfig, set_compilation_config
from slotwise.custom_op import CustomOpRegistry
from slotwise.layers import RMSNorm, RotaryEmbedding, SiluAndMul
from slotwise.platforms import use_platform

HIDDEN, HEAD_SIZE, NUM_TOKENS = 64, 16, 5


class Block(nn.Module):
    """Pre-norm block: norm with residual, rotary on q/k, gated MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(HIDDEN)
        self.rope = RotaryEmbedding(HEAD_SIZE, 128, is_neox_style=True)
        self.rope_gptj = RotaryEmbedding(HEAD_SIZE, 128, is_neox_style=False)
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.act = SiluAndMul()
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self.norm(x, residual)
        query, key = self.rope(positions, hidden, hidden[:, : 2 * HEAD_SIZE].contiguous())
        query, key = self.rope_gptj(positions, query, key)
        hidden = query + key.repeat(1, HIDDEN // (2 * HEAD_SIZE))
        return self.down(self.act(self.up(hidden))), residual


def replacement_rms_norm(layer, x, residual=None):
    """A plugin's RMSNorm: the native one behind a clamp that shows up in the graph."""
    return layer.forward_native(torch.clamp(x, -1e4, 1e4), residual)


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import torch._dynamo

    monkeypatch.delenv("SLOTWISE_COMPILATION_CONFIG", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def build(custom_ops: list[str], monkeypatch: pytest.MonkeyPatch, replace: bool) -> Block:
    registry = CustomOpRegistry()
    if replace:
        registry.register("cpu", "rms_norm", replacement_rms_norm)
    monkeypatch.setattr(custom_op_module, "get_custom_op_registry", lambda: registry)
    config = CompilationConfig(backend="eager", custom_ops=custom_ops)
    with use_platform(CpuOpsPlatform()), set_compilation_config(config):
        torch.manual_seed(0)
        return Block().eval()


def inputs(num_tokens: int = NUM_TOKENS) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(num_tokens)
    positions = torch.randint(0, 128, (num_tokens,), generator=gen)
    x = torch.randn(num_tokens, HIDDEN, generator=gen)
    return positions, x, torch.randn(num_tokens, HIDDEN, generator=gen)


@pytest.mark.parametrize(
    "custom_ops, replace, implementation, marker",
    [
        (["none"], False, "native", "rsqrt"),
        ([], False, "cpu", "rms_norm"),
        ([], True, "plugin", "clamp"),
    ],
    ids=["native", "forward_cpu", "plugin_replacement"],
)
def test_block_compiles_to_one_graph_without_breaks(
    monkeypatch, custom_ops, replace, implementation, marker
):
    model = build(custom_ops, monkeypatch, replace)
    from torch._dynamo.testing import CompileCounterWithBackend

    assert model.norm.implementation == implementation
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        expected = model(*inputs())
        actual = compiled(*inputs())
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert counter.frame_count == 1
    graph = str(counter.graphs[0].graph)
    assert marker in graph
    if implementation != "cpu":
        assert "rms_norm" not in graph  # F.rms_norm is forward_cpu's alone


def test_fullgraph_eager_compile_serves_other_token_counts(monkeypatch):
    model = build([], monkeypatch, replace=False)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        for num_tokens in (NUM_TOKENS, 9, 1):
            expected = model(*inputs(num_tokens))
            actual = compiled(*inputs(num_tokens))
            for got, want in zip(actual, expected, strict=True):
                torch.testing.assert_close(got, want)
