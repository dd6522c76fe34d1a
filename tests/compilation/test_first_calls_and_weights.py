"""What users vary and a one-model test suite does not: the size of the first call, the
weights behind one compile cache, a failing first call, and threads (Llama checkpoints
sharing a cache: engine/tests/compilation).

Each compiled result is compared with the same weights run eagerly.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from slotwise.compilation import (
    CompilationConfig,
    SizeSpecializationError,
    counters,
    support_torch_compile,
)
from slotwise.compilation.compilers import CompiledPiece, EagerCompiler
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, ToyTransformer

SIZES = (0, 1, 2, 5, 9)


def toy_pair(seed: int, config: CompilationConfig) -> tuple[ToyTransformer, ToyTransformer]:
    """A compiled ToyTransformer with weights from ``seed`` and its eager twin."""
    torch.manual_seed(seed)
    compiled = ToyTransformer(compilation_config=config)
    eager = ToyTransformer(compilation_config=CompilationConfig(level=0))
    eager.load_state_dict(compiled.state_dict())
    return compiled, eager


def assert_matches_eager(compiled: nn.Module, eager: nn.Module, sizes=SIZES) -> None:
    for size in sizes:
        ids = torch.randint(0, 64, (size,))
        torch.testing.assert_close(compiled(ids), eager(ids), msg=f"size {size}")


@pytest.mark.slow
@pytest.mark.parametrize("first_size", [0, 1, 2, 3, 4])
def test_inductor_pieces_are_general_whatever_the_first_size_and_the_weights(tmp_path, first_size):
    config = CompilationConfig(
        level=3, backend="inductor", splitting_ops=TOY_SPLITTING_OPS, cache_dir=str(tmp_path)
    )
    for seed in (0, 1):  # the second weight set loads what the first one compiled
        compiled, eager = toy_pair(seed, config)
        ids = torch.randint(0, 64, (first_size,))
        expected_hits = 0 if seed == 0 else 3
        with counters.expect(num_cache_hits=expected_hits):
            torch.testing.assert_close(compiled(ids), eager(ids))
        assert_matches_eager(compiled, eager)


def test_a_failing_first_call_leaves_the_model_usable():
    compiled, eager = toy_pair(0, CompilationConfig(level=3, backend="eager"))
    with pytest.raises(IndexError):
        compiled(torch.tensor([1, 64]))  # out of the embedding's range
    with counters.expect(num_models_seen=1):
        assert_matches_eager(compiled, eager)


@support_torch_compile
class BranchesOnSize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * 2 if x.shape[0] == 1 else self.proj(x)


@pytest.mark.parametrize("first_size", [1, 3])
def test_a_model_that_branches_on_the_dynamic_size_is_refused(first_size):
    model = BranchesOnSize(compilation_config=CompilationConfig(level=3, backend="eager"))
    with pytest.raises(SizeSpecializationError) as caught:
        model(torch.randn(first_size, 4))
    message = str(caught.value)
    assert "BranchesOnSize.forward takes a different path" in message
    assert "dynamic_arg_dims" in message
    assert "x.shape[0] == 1" in message  # the offending line


@support_torch_compile
class TokensAndPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(64, 8)
        self.positions = nn.Embedding(64, 8)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.tokens(input_ids) * 2 + self.positions(positions)


@pytest.mark.parametrize("level", [2, 3])
def test_a_first_call_passing_one_tensor_twice_does_not_tie_the_later_calls(level):
    torch.manual_seed(0)
    model = TokensAndPositions(compilation_config=CompilationConfig(level=level, backend="eager"))
    eager = TokensAndPositions(compilation_config=CompilationConfig(level=0))
    eager.load_state_dict(model.state_dict())
    same = torch.tensor([3, 1, 4])
    torch.testing.assert_close(model(same, same), eager(same, same))
    for size in (1, 2, 5):  # guards are dropped: these reuse the first call's trace
        ids, positions = torch.randint(0, 64, (size,)), torch.randint(0, 64, (size,))
        torch.testing.assert_close(model(ids, positions), eager(ids, positions))
    with counters.expect(num_models_seen=0):
        model(same, same)


@pytest.mark.slow
@pytest.mark.parametrize("inference", [False, True], ids=["grad-mode", "inference-mode"])
def test_a_first_call_on_views_is_recorded_and_warm_starts_the_next_model(
    tmp_path, caplog, inference
):
    # A runner's step passes views of its persistent buffers, in inference mode when an
    # engine steps it. Inductor: the eager backend saves nothing, traces included.
    config = CompilationConfig(
        level=3, backend="inductor", splitting_ops=TOY_SPLITTING_OPS, cache_dir=str(tmp_path)
    )
    buffer = torch.randint(0, 64, (16,))
    for seed, traces in ((0, 1), (1, 0)):  # the second model starts from the first's trace
        compiled, eager = toy_pair(seed, config)
        with counters.expect(num_graphs_seen=traces), torch.inference_mode(inference):
            torch.testing.assert_close(compiled(buffer[:5]), eager(buffer[:5]))
        assert_matches_eager(compiled, eager)
    assert "warm start" not in caplog.text


class SlowCountingCompiler(EagerCompiler):
    """Eager, but slow enough for threads to overlap, counting compiles in flight."""

    lock = threading.Lock()
    in_flight = 0
    most_in_flight = 0

    def compile(self, graph, example_inputs, *, runtime_shape):
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        time.sleep(0.05)
        try:
            return CompiledPiece(fn=graph.forward)
        finally:
            with cls.lock:
                cls.in_flight -= 1


def test_models_built_and_run_in_eight_threads_compile_one_at_a_time():
    # Size 3 is compiled at its first use, outside Dynamo's own lock.
    config = CompilationConfig(
        level=3,
        backend=f"{__name__}:SlowCountingCompiler",
        splitting_ops=TOY_SPLITTING_OPS,
        compile_sizes=[3],
    )
    failures: list[str] = []

    def build_and_run(seed: int) -> None:
        try:
            compiled, eager = toy_pair(seed, config)
            assert_matches_eager(compiled, eager, sizes=(3, 1, 6))
        except Exception as err:  # noqa: BLE001 - reported by the main thread
            failures.append(f"thread {seed}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=build_and_run, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert SlowCountingCompiler.most_in_flight == 1
