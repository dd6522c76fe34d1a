"""The CPU platform compiles a model as one graph at level 3: it has no static graphs,
the only reason to split at attention.  A user's own ``splitting_ops`` always wins."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from slotwise.attention.ops import UNIFIED_ATTENTION_OP
from slotwise.compilation import CompilationConfig, counters
from slotwise.compilation.compiled_forward import prepare_config
from slotwise_cpu.platform import CpuPlatform
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner


def test_level_three_keeps_the_graph_whole_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="slotwise"):
        adapted = prepare_config(CompilationConfig(level=3), CpuPlatform())
    assert adapted.splitting_ops == [] and adapted.resolved_splitting_ops == []
    assert "platform cpu set compilation splitting_ops: None -> []" in caplog.text


@pytest.mark.parametrize(
    "config",
    [
        CompilationConfig(level=3, splitting_ops=[UNIFIED_ATTENTION_OP]),
        CompilationConfig(level=3, splitting_ops=["aten::mm"]),
        CompilationConfig(level=2),
        CompilationConfig(level=0),
    ],
    ids=["user's attention split", "user's own op", "level 2", "level 0"],
)
def test_a_users_splitting_ops_and_other_levels_are_left_alone(config):
    assert prepare_config(config, CpuPlatform()).splitting_ops == config.splitting_ops


def test_a_cpu_platform_with_static_graphs_keeps_the_split():
    class WithGraphs(CpuPlatform):
        def get_graph_api(self, **kwargs: Any) -> object:
            return object()

    adapted = prepare_config(CompilationConfig(level=3, graph_mode="NONE"), WithGraphs())
    assert adapted.resolved_splitting_ops == [UNIFIED_ATTENTION_OP]


def test_the_whole_graph_runs_attention_inside_inductors_code(tmp_path):
    """One piece, compiled by Inductor with the attention op in it, gives eager's logits
    for a first step of 1 token, then 2, then a mixed batch, then decodes."""

    def logits(config: CompilationConfig) -> list[torch.Tensor]:
        model = build_llama("tiny", seed=0, compilation_config=config)
        runner = ModelRunner(model, num_blocks=16)
        single, pair, five = runner.add_requests([[9], [2, 6], [3, 1, 4, 1, 5]], 4)
        steps = [runner.step([single]), runner.step([pair])]
        for request in (single, pair):
            request.tokens.append(7)
        steps.append(runner.step([single, pair, five]))  # two decodes and a prefill
        for _ in range(2):
            for request in (single, pair, five):
                request.tokens.append(11)
            steps.append(runner.step([single, pair, five]))
        return steps

    eager = logits(CompilationConfig(level=0))
    with counters.expect(num_graphs_seen=1, num_piecewise_graphs_seen=1):
        whole = logits(CompilationConfig(level=3, cache_dir=str(tmp_path)))
    for got, want in zip(whole, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
