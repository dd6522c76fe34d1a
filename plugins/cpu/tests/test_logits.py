"""The CPU plugin's ``logits`` custom op: the LM head's product on the small-GEMM kernel.

Oracles: the product in float64 (the kernel accumulates in float32 and rounds once to
the weights' dtype, as torch's GEMM does), and torch's own product wherever the
replacement hands it to torch.  The replacement is found through the CPU
plugin's real entry point, as installed.
"""

from __future__ import annotations

import pytest
import torch
from kernel_oracles import torch_product

from slotwise.compilation.config import CompilationConfig
from slotwise_cpu import linear
from slotwise_engine.models.llama import build_llama


def tiny(dtype: torch.dtype, **config: object):
    return build_llama("tiny", dtype=dtype, compilation_config=CompilationConfig(**config))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows", [1, 3])
def test_the_lm_head_of_a_level3_model_runs_the_plugin_and_matches_float64(dtype, rows):
    # Level 3 under Inductor: core ops default to native code there, this one must not.
    model = tiny(dtype, level=3, backend="inductor")
    assert model.logits_head.implementation == "plugin"
    hidden = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows)).to(dtype)
    logits = model.compute_logits(hidden)
    expected = hidden.double() @ model.lm_head.weight.double().T
    assert logits.dtype == torch.float32 and logits.shape == (rows, 256)
    ulp = torch.finfo(dtype).eps * expected.abs()
    assert bool(((logits.double() - expected).abs() <= ulp + 1e-4).all())


def test_rows_the_kernel_does_not_take_are_torch_s_product():
    model = tiny(torch.bfloat16, level=0)
    hidden = torch.randn(linear.max_kernel_rows(torch.bfloat16) + 1, 64).bfloat16()
    assert model.logits_head.implementation == "plugin"
    expected = torch_product(hidden, model.lm_head.weight).float()
    assert torch.equal(model.compute_logits(hidden), expected)


@pytest.mark.parametrize("setting", ["-logits", "none"])
def test_custom_ops_settings_still_turn_the_replacement_off(setting):
    model = tiny(torch.bfloat16, level=3, custom_ops=[setting])
    assert model.logits_head.implementation == "native"


def test_a_trainable_head_keeps_its_gradient():
    # The kernel has no backward: a head whose weight requires grad runs the native code.
    model = tiny(torch.float32, level=0)
    model.lm_head.weight.requires_grad_(True)
    hidden = torch.randn(1, 64)
    model.compute_logits(hidden).sum().backward()
    expected = model.lm_head.weight.detach().clone().requires_grad_()
    (hidden @ expected.T).sum().backward()
    torch.testing.assert_close(model.lm_head.weight.grad, expected.grad)
