"""Level 3 with Inductor on the CPU: each piece is Inductor's C++ code, results match eager."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig, counters
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel, ToyTransformer

pytestmark = pytest.mark.slow


def test_inductor_pieces_match_eager_inside_and_outside_compile_sizes(tmp_path):
    config = CompilationConfig(
        level=3,
        backend="inductor",
        splitting_ops=TOY_SPLITTING_OPS,
        compile_sizes=[4],
        cache_dir=str(tmp_path),
    )
    torch.manual_seed(0)
    model = SillyModel(compilation_config=config)
    torch.manual_seed(0)
    reference = SillyModel(compilation_config=CompilationConfig(level=0))
    with counters.expect(num_backend_compilations=3, num_piecewise_capturable_graphs_seen=3):
        x = torch.randn(5, 8)
        torch.testing.assert_close(model(x), reference(x))
    with counters.expect(num_backend_compilations=3):  # the specialised size-4 pieces
        x = torch.randn(4, 8)
        torch.testing.assert_close(model(x), reference(x))
    with counters.expect(num_backend_compilations=0, num_inductor_compiles=0):
        for size in (0, 1, 2, 3, 4, 9, 33):
            x = torch.randn(size, 8)
            torch.testing.assert_close(model(x), reference(x))


def test_identical_transformer_layers_compile_once(tmp_path):
    config = CompilationConfig(
        level=3, backend="inductor", splitting_ops=TOY_SPLITTING_OPS, cache_dir=str(tmp_path)
    )
    torch.manual_seed(0)
    model = ToyTransformer(6, compilation_config=config)
    torch.manual_seed(0)
    reference = ToyTransformer(6, compilation_config=CompilationConfig(level=0))
    ids = torch.randint(0, 64, (5,))
    # 7 capturable pieces: the first, 5 alike middle ones and the last -> 3 real compiles.
    with counters.expect(num_backend_compilations=7, num_inductor_compiles=3, num_cache_hits=4):
        torch.testing.assert_close(model(ids), reference(ids))
