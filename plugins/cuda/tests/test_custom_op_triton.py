"""The CUDA plugin's Triton implementations of the core ops agree with ``forward_native``.

They run compiled on a GPU when there is one, else in Triton's interpreter on CPU
tensors: conftest.py imports the kernel modules for it, before this module imports
``slotwise_cuda.custom_ops``, which holds them.
"""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig, set_compilation_config
from slotwise.custom_op import get_custom_op_registry
from slotwise.layers import RMSNorm, RotaryEmbedding, SiluAndMul
from slotwise.platforms import use_platform
from slotwise_cuda import custom_ops
from slotwise_cuda.platform import CudaPlatform

CORE_OPS = {"rms_norm", "silu_and_mul", "rotary_embedding"}
#: (atol, rtol): the kernels compute in fp32 and round once; forward_native may round
#: twice, and the interpreter rounds bf16 its own way, so bf16 differs by up to ~2 ulp.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 1.6e-2)}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol, rtol = TOLERANCE[expected.dtype]
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


def randn(*shape: int, seed: int, dtype: torch.dtype, device: str, scale=1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


# -- RMSNorm ---------------------------------------------------------------------------


def make_rms_norm(hidden: int, dtype: torch.dtype, device: str) -> RMSNorm:
    layer = RMSNorm(hidden, eps=1e-5)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(hidden, generator=torch.Generator().manual_seed(7)) + 0.5)
    return layer.to(dtype=dtype, device=device)


@DTYPES
@pytest.mark.parametrize("hidden", [64, 80, 5000])  # 5000: wider than one 4096 chunk
def test_rms_norm(device, dtype, hidden):
    layer = make_rms_norm(hidden, dtype, device)
    x = randn(2, 3, hidden, seed=hidden, dtype=dtype, device=device, scale=3)
    original = x.clone()
    assert_close(custom_ops.rms_norm(layer, x), layer.forward_native(x))
    assert torch.equal(x, original)


@DTYPES
def test_rms_norm_with_residual(device, dtype):
    layer = make_rms_norm(96, dtype, device)
    x = randn(5, 96, seed=1, dtype=dtype, device=device)
    residual = randn(5, 96, seed=2, dtype=dtype, device=device)
    inputs = (x.clone(), residual.clone())
    normed, new_residual = custom_ops.rms_norm(layer, x, residual)
    native_normed, native_residual = layer.forward_native(x, residual)
    assert_close(normed, native_normed)
    assert torch.equal(new_residual, native_residual)
    assert torch.equal(x, inputs[0]) and torch.equal(residual, inputs[1])


def test_rms_norm_of_a_strided_view_and_of_no_tokens(device):
    layer = make_rms_norm(64, torch.float32, device)
    wide = randn(6, 128, seed=3, dtype=torch.float32, device=device)
    x = wide[:, 32:96]  # rows of a larger buffer
    assert_close(custom_ops.rms_norm(layer, x), layer.forward_native(x))
    empty = torch.empty(0, 64, device=device)
    assert custom_ops.rms_norm(layer, empty).shape == (0, 64)


def test_rms_norm_output_dtype_does_not_depend_on_the_implementation(device):
    layer = make_rms_norm(64, torch.float32, device)  # fp32 weight
    x = randn(4, 64, seed=5, dtype=torch.bfloat16, device=device)
    assert custom_ops.rms_norm(layer, x).dtype == layer.forward_native(x).dtype


# -- SiluAndMul ------------------------------------------------------------------------


@DTYPES
@pytest.mark.parametrize("shape", [(7, 2 * 64), (2, 3, 2 * 40), (3, 2 * 1500)])
def test_silu_and_mul(device, dtype, shape):
    layer = SiluAndMul()
    x = randn(*shape, seed=shape[-1], dtype=dtype, device=device, scale=4)
    assert_close(custom_ops.silu_and_mul(layer, x), layer.forward_native(x))


def test_silu_and_mul_of_a_strided_view(device):
    layer = SiluAndMul()
    x = randn(5, 256, seed=9, dtype=torch.float32, device=device)[:, :128]
    assert_close(custom_ops.silu_and_mul(layer, x), layer.forward_native(x))


# -- RotaryEmbedding -------------------------------------------------------------------


@DTYPES
@pytest.mark.parametrize("is_neox_style", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("head_size", [64, 80])
@pytest.mark.parametrize("positions_dtype", [torch.int64, torch.int32])
def test_rotary_embedding_on_views_of_a_fused_qkv(
    device, dtype, is_neox_style, head_size, positions_dtype
):
    layer = RotaryEmbedding(head_size, 2048, is_neox_style=is_neox_style).to(device)
    num_tokens, q_width, k_width = 6, 4 * head_size, 2 * head_size
    qkv = randn(num_tokens, q_width + 2 * k_width, seed=head_size, dtype=dtype, device=device)
    query, key = qkv[:, :q_width], qkv[:, q_width : q_width + k_width]
    gen = torch.Generator().manual_seed(11)
    positions = torch.randint(0, 2048, (num_tokens,), generator=gen).to(positions_dtype)
    positions = positions.to(device)
    before = qkv.clone()
    out_query, out_key = custom_ops.rotary_embedding(layer, positions, query, key)
    native_query, native_key = layer.forward_native(positions, query, key)
    assert_close(out_query, native_query)
    assert_close(out_key, native_key)
    assert torch.equal(qkv, before)  # like forward_native, returns new tensors


# -- registered for the cuda platform through the plugin's real entry point ------------


def test_the_cuda_plugin_registers_every_core_op():
    registered = {op for op, platform in get_custom_op_registry().entries() if platform == "cuda"}
    assert registered == CORE_OPS
    for op in CORE_OPS:
        assert get_custom_op_registry().lookup(op, "cuda") is getattr(custom_ops, op)


def test_layers_on_the_cuda_platform_run_the_triton_versions(device, monkeypatch):
    launched: list[str] = []
    for module, name in (
        (custom_ops.layernorm, "rms_norm"),
        (custom_ops.activation, "silu_and_mul"),
        (custom_ops.rotary, "rotary_embedding"),
    ):
        launcher = getattr(module, name)

        def recording(*args, _launcher=launcher, _name=name, **kwargs):
            launched.append(_name)
            return _launcher(*args, **kwargs)

        monkeypatch.setattr(module, name, recording)

    with use_platform(CudaPlatform()), set_compilation_config(CompilationConfig(backend="eager")):
        norm = make_rms_norm(64, torch.float32, device)
        act = SiluAndMul()
        rope = RotaryEmbedding(32, 128).to(device)
    assert [norm.implementation, act.implementation, rope.implementation] == ["plugin"] * 3
    x = randn(3, 64, seed=12, dtype=torch.float32, device=device)
    positions = torch.tensor([0, 5, 127], device=device)
    assert_close(norm(x), norm.forward_native(x))
    assert_close(act(x), act.forward_native(x))
    out_query, out_key = rope(positions, x, x[:, :32])
    native_query, native_key = rope.forward_native(positions, x, x[:, :32])
    assert_close(out_query, native_query)
    assert_close(out_key, native_key)
    assert launched == ["rms_norm", "silu_and_mul", "rotary_embedding"]


# -- inside a level-3 compile ----------------------------------------------------------


class Block(torch.nn.Module):
    """The three ops as a decoder layer uses them: norm with residual, rotary, gated MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = make_rms_norm(64, torch.float32, "cpu")
        self.rope = RotaryEmbedding(32, 128)
        self.act = SiluAndMul()

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        hidden, residual = self.norm(x, residual)
        query, key = self.rope(positions, hidden, hidden[:, :32])
        return self.act(query), key, residual


@pytest.mark.parametrize("first_size", [1, 0, 2])
def test_level_3_compiles_the_triton_ops_for_every_batch_size(device, first_size):
    """A trace at level 3 has a symbol for the batch size, whatever the first call's size;
    on a GPU the launchers failed there (they branch on it) before they were torch ops."""
    import torch._dynamo

    import slotwise

    torch._dynamo.reset()
    # No CUDA graphs: without a GPU there are none to capture; the trace is what is tested.
    config = CompilationConfig(level=3, backend="eager", graph_mode="NONE")
    with use_platform(CudaPlatform()), set_compilation_config(config):
        block = Block().to(device)
        compiled = slotwise.compile(Block().to(device), config)
    compiled.load_state_dict(block.state_dict())
    assert compiled.norm.implementation == "plugin"
    for num_tokens in (first_size, 3, 1, 0, 5):
        positions = torch.arange(num_tokens, device=device) * 7
        x = randn(num_tokens, 64, seed=num_tokens, dtype=torch.float32, device=device)
        residual = randn(num_tokens, 64, seed=99, dtype=torch.float32, device=device)
        with torch.no_grad():
            actual = compiled(positions, x, residual)
            expected = block(positions, x, residual)
        for got, want in zip(actual, expected, strict=True):
            assert_close(got, want)
    torch._dynamo.reset()
