"""The batch and model that the runner's graph tests share: prompts whose prefill and
decodes land on padded capture sizes, and the tiny preset with the Triton kernels' head
size."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig
from slotwise.compilation.static_graphs.contract import reset_capture_window
from slotwise_engine.models.llama import LlamaConfig, build_llama
from slotwise_engine.runner.model_runner import ModelRunner

#: 7 prompt tokens: the prefill pads to capture size 8, the decodes of 3 to 4.
PROMPTS = [[1, 5, 9], [7, 7], [42, 11]]
SIZES = [1, 2, 4, 8]
#: 4 blocks of 16: the block table's fixed width in the Twins' runners.
MAX_MODEL_LEN = 64
#: The tiny preset with head size 32, which the Triton kernels take.
TINY_HEAD_32 = LlamaConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1
)


@pytest.fixture(autouse=True)
def _lazy_captures_after_each_test():
    """Every test starts with captures lazy again, whatever the test before it did."""
    yield
    reset_capture_window()


class Twins:
    """A runner in ``graph_mode`` and its eager twin, stepped together over their own
    copies of the same requests; every step's logits are compared."""

    def __init__(self, graph_mode: str) -> None:
        config = CompilationConfig(
            level=3, backend="eager", capture_sizes=SIZES, graph_mode=graph_mode
        )
        eager = CompilationConfig(level=0)
        self.runners = [
            ModelRunner(
                build_llama("tiny", seed=0, compilation_config=c),
                num_blocks=32,
                max_model_len=MAX_MODEL_LEN,
            )
            for c in (config, eager)
        ]
        #: The runner with graphs.
        self.graph = self.runners[0]
        self.requests: dict[str, tuple] = {}

    def join(self, name: str, prompt: list[int]) -> None:
        self.requests[name] = tuple(
            runner.add_requests([prompt], MAX_MODEL_LEN - len(prompt))[0] for runner in self.runners
        )

    def leave(self, name: str) -> None:
        for runner, request in zip(self.runners, self.requests.pop(name), strict=True):
            runner.free([request])

    def step(self, names: list[str]) -> None:
        """One step of both runners over the requests ``names``, in that order; each
        request then gets the eager step's greedy token."""
        graphs, eager = (
            runner.step([self.requests[name][i] for name in names])
            for i, runner in enumerate(self.runners)
        )
        torch.testing.assert_close(graphs, eager, rtol=1e-4, atol=1e-4)
        for name, token in zip(names, eager.argmax(-1).tolist(), strict=True):
            for request in self.requests[name]:
                request.tokens.append(token)

    def recorded(self) -> list[int]:
        """The padded sizes whose uniform decodes replay a recorded call list."""
        return sorted(g.padded_size for g in self.graph.recorded_steps or {})
