"""Level 3 with Inductor on the CPU without a C++ compiler: one error before any compile."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig, counters
from slotwise.compilation.config import ConfigError
from slotwise.platforms import get_current_platform
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel

pytestmark = pytest.mark.skipif(
    get_current_platform().device_type != "cpu", reason="Inductor's C++ code is for the CPU"
)


def test_no_cpp_compiler_stops_before_the_first_compile(tmp_path):
    from torch._inductor import config as inductor_config

    config = CompilationConfig(
        level=3, backend="inductor", splitting_ops=TOY_SPLITTING_OPS, cache_dir=str(tmp_path)
    )
    model = SillyModel(compilation_config=config)
    # Inductor's own patch, not monkeypatch: undoing a monkeypatch deletes the setting
    # from Inductor's config module for the rest of the process.
    with (
        inductor_config.patch({"cpp.cxx": (None, "no-such-compiler-g++")}),
        counters.expect(num_inductor_compiles=0),
        pytest.raises(ConfigError) as info,
    ):
        model(torch.randn(5, 8))
    message = str(info.value)
    assert "'no-such-compiler-g++'" in message and "is not on the PATH" in message
    assert "install g++" in message and "level 0" in message
