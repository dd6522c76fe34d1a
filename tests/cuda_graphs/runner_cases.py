"""The batch and model that the runner's graph tests share: prompts whose prefill and
decodes land on padded capture sizes, and the tiny preset with the Triton kernels' head
size."""

from __future__ import annotations

import pytest

from slotwise.compilation.static_graphs.contract import reset_capture_window
from slotwise.models.llama import LlamaConfig

#: 7 prompt tokens: the prefill pads to capture size 8, the decodes of 3 to 4.
PROMPTS = [[1, 5, 9], [7, 7], [42, 11]]
SIZES = [1, 2, 4, 8]
#: The tiny preset with head size 32, which the Triton kernels take.
TINY_HEAD_32 = LlamaConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1
)


@pytest.fixture(autouse=True)
def _lazy_captures_after_each_test():
    """Every test starts with captures lazy again, whatever the test before it did."""
    yield
    reset_capture_window()
