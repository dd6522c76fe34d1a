"""Which implementation a CustomOp runs: decided once, at construction.

Rules (slotwise.custom_op): the ``custom_ops`` setting may send an op to
``forward_native``; else a replacement a plugin registered for the op and the current
platform; else ``forward_<platform.custom_op_key>`` where the class defines it; else
``forward_native``.  Each test checks both the label (``layer.implementation``) and
which method actually ran.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest
import torch
from custom_op_platforms import CpuOpsPlatform

import slotwise.custom_op as custom_op_module
from slotwise.compilation import CompilationConfig, set_compilation_config
from slotwise.custom_op import CORE_OP_NAMES, CustomOp, CustomOpError, CustomOpRegistry
from slotwise.layers import RMSNorm, RotaryEmbedding, SiluAndMul
from slotwise.platforms import Platform, use_platform

FORWARDS = ("forward_native", "forward_cpu", "forward_cuda", "forward_oot")


class OotPlatform(Platform):
    """An out-of-tree accelerator that runs ``CustomOp.forward_oot``."""

    name = "custom_ops_test_oot"
    device_type = "cpu"
    custom_op_key = "oot"
    default_compile_backend = "eager"


@pytest.fixture(autouse=True)
def _no_config_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLOTWISE_COMPILATION_CONFIG", raising=False)


@pytest.fixture
def cpu_platform() -> Iterator[Platform]:
    with use_platform(CpuOpsPlatform()) as platform:
        yield platform


@pytest.fixture
def oot_platform() -> Iterator[Platform]:
    with use_platform(OotPlatform()) as platform:
        yield platform


@pytest.fixture
def op_classes(monkeypatch: pytest.MonkeyPatch) -> dict[str, type[CustomOp]]:
    """A copy of the op table that CustomOp subclasses defined by a test go into."""
    table = dict(CustomOp.op_classes)
    monkeypatch.setattr(CustomOp, "op_classes", table)
    return table


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> CustomOpRegistry:
    """An empty replacement registry in place of the one the installed plugins filled."""
    fresh = CustomOpRegistry()
    monkeypatch.setattr(custom_op_module, "get_custom_op_registry", lambda: fresh)
    return fresh


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names (``Class.forward_x``) of the core ops' methods called, in order."""
    calls: list[str] = []

    def recording(label: str, method):
        def wrapper(self, *args, **kwargs):
            calls.append(label)
            return method(self, *args, **kwargs)

        return wrapper

    for cls in (RMSNorm, SiluAndMul, RotaryEmbedding):
        for name in FORWARDS:
            method = vars(cls).get(name)
            if method is not None:
                monkeypatch.setattr(cls, name, recording(f"{cls.__name__}.{name}", method))
    return calls


def run_rms_norm(layer: RMSNorm) -> torch.Tensor:
    return layer(torch.randn(3, layer.weight.shape[0]))


def run_silu_and_mul(layer: SiluAndMul) -> torch.Tensor:
    return layer(torch.randn(3, 16))


# -- a CPU platform ------------------------------------------------------------------------


def test_cpu_platform_runs_forward_cpu_where_a_class_has_one_and_native_elsewhere(
    cpu_platform, ran
):
    with set_compilation_config(CompilationConfig(backend="eager")):
        norm, act = RMSNorm(8), SiluAndMul()
    assert norm.implementation == "cpu"
    assert act.implementation == "native"
    assert "implementation=cpu" in repr(norm)
    run_rms_norm(norm)
    run_silu_and_mul(act)
    assert ran == ["RMSNorm.forward_cpu", "SiluAndMul.forward_native"]


@pytest.fixture
def scale_op(op_classes) -> type[CustomOp]:
    """A second op with a forward_cpu, to see that settings for rms_norm leave it alone."""

    class Scale(CustomOp):
        op_name = "custom_ops_test_scale"

        def forward_native(self, x: torch.Tensor) -> torch.Tensor:
            return x * 3

        def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
            return x + x + x

    return Scale


def settings_id(value: object) -> str:
    if isinstance(value, dict):
        return ",".join(f"{key}={item}" for key, item in value.items()) or "defaults"
    return str(value)


@pytest.mark.parametrize(
    "settings, rms_norm, scale",
    [
        ({"backend": "eager"}, "cpu", "cpu"),
        ({"backend": "eager", "custom_ops": ["none"]}, "native", "native"),
        ({"backend": "eager", "custom_ops": ["-rms_norm"]}, "native", "cpu"),
        ({"backend": "eager", "custom_ops": ["none", "+rms_norm"]}, "cpu", "native"),
        ({"backend": "eager", "custom_ops": ["all", "-rms_norm"]}, "native", "cpu"),
        # default rule: Inductor at level 3 fuses the native code, so it gets that
        ({"level": 3, "backend": "inductor"}, "native", "native"),
        ({"level": 3, "backend": ""}, "native", "native"),  # the cpu platform's default
        ({}, "native", "native"),  # which is the default config
        ({"level": 3, "backend": "eager"}, "cpu", "cpu"),
        ({"level": 2, "backend": "inductor"}, "cpu", "cpu"),
        ({"level": 0}, "cpu", "cpu"),
        ({"level": 3, "backend": "inductor", "custom_ops": ["all"]}, "cpu", "cpu"),
        ({"level": 3, "backend": "inductor", "custom_ops": ["+rms_norm"]}, "cpu", "native"),
    ],
    ids=settings_id,
)
def test_custom_ops_setting_picks_the_implementation(
    cpu_platform, ran, scale_op, settings, rms_norm, scale
):
    with set_compilation_config(CompilationConfig(**settings)):
        norm, other, act = RMSNorm(8), scale_op(), SiluAndMul()
    assert (norm.implementation, other.implementation) == (rms_norm, scale)
    assert act.implementation == "native"  # it has no forward_cpu
    run_rms_norm(norm)
    run_silu_and_mul(act)
    assert ran == [f"RMSNorm.forward_{rms_norm}", "SiluAndMul.forward_native"]


def test_default_config_on_the_cpu_is_level_3_inductor_so_native(cpu_platform, ran):
    norm = RMSNorm(8)
    assert norm.implementation == "native"
    run_rms_norm(norm)
    assert ran == ["RMSNorm.forward_native"]


def test_setting_comes_from_the_environment_when_no_config_is_set(cpu_platform, monkeypatch):
    monkeypatch.setenv("SLOTWISE_COMPILATION_CONFIG", '{"backend": "eager"}')
    assert RMSNorm(8).implementation == "cpu"
    monkeypatch.setenv(
        "SLOTWISE_COMPILATION_CONFIG", '{"backend": "eager", "custom_ops": ["-rms_norm"]}'
    )
    assert RMSNorm(8).implementation == "native"


def test_choice_is_made_once_at_construction(cpu_platform, ran):
    with set_compilation_config(CompilationConfig(backend="eager", custom_ops=["none"])):
        native = RMSNorm(8)
    with set_compilation_config(CompilationConfig(backend="eager")):
        fast = RMSNorm(8)
        run_rms_norm(native)
    with set_compilation_config(CompilationConfig(backend="eager", custom_ops=["none"])):
        run_rms_norm(fast)
    assert ran == ["RMSNorm.forward_native", "RMSNorm.forward_cpu"]


# -- out-of-tree platforms -------------------------------------------------------------


def test_oot_platform_runs_forward_oot(oot_platform, op_classes):
    class Doubling(CustomOp):
        op_name = "custom_ops_test_doubling"

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def forward_native(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.append("native")
            return x * 2

        def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.append("oot")
            return x + x

    layer = Doubling()
    assert layer.implementation == "oot"
    x = torch.randn(4)
    torch.testing.assert_close(layer(x), x * 2)
    assert layer.calls == ["oot"]
    with set_compilation_config(CompilationConfig(custom_ops=["-custom_ops_test_doubling"])):
        assert Doubling().implementation == "native"


def test_oot_platform_runs_native_for_ops_without_forward_oot(oot_platform, ran):
    norm = RMSNorm(8)
    assert norm.implementation == "native"
    run_rms_norm(norm)
    assert ran == ["RMSNorm.forward_native"]


def test_platform_default_backend_feeds_the_default_rule(oot_platform, op_classes):
    class Halving(CustomOp):
        op_name = "custom_ops_test_halving"

        def forward_native(self, x: torch.Tensor) -> torch.Tensor:
            return x / 2

        def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
            return x * 0.5

    # level 3 with backend "" is the platform's "eager": the platform kernel runs
    assert Halving().implementation == "oot"
    with set_compilation_config(CompilationConfig(level=3, backend="inductor")):
        assert Halving().implementation == "native"


# -- replacements registered by plugins (in process; see test_custom_op_plugins.py) -----


def test_registered_replacement_wins_over_the_platform_method(cpu_platform, registry, ran):
    seen = []

    def replacement(layer, x, residual=None):
        seen.append((layer, residual))
        return layer.forward_native(x, residual)

    registry.register("cpu", "rms_norm", replacement)
    with set_compilation_config(CompilationConfig(backend="eager")):
        norm = RMSNorm(8)
        act = SiluAndMul()
    assert norm.implementation == "plugin"
    assert act.implementation == "native"
    run_rms_norm(norm)
    assert seen == [(norm, None)]  # the layer comes first, like self
    assert ran == ["RMSNorm.forward_native"]  # called by the replacement, not instead of it


def test_replacement_for_another_platform_is_not_used(cpu_platform, registry):
    registry.register("cuda", "rms_norm", lambda layer, x, residual=None: x)
    with set_compilation_config(CompilationConfig(backend="eager")):
        assert RMSNorm(8).implementation == "cpu"


def test_custom_ops_setting_turns_a_replacement_off(cpu_platform, registry):
    registry.register("cpu", "rms_norm", lambda layer, x, residual=None: x)
    with set_compilation_config(CompilationConfig(backend="eager", custom_ops=["-rms_norm"])):
        assert RMSNorm(8).implementation == "native"
    with set_compilation_config(CompilationConfig(level=3, backend="inductor")):
        assert RMSNorm(8).implementation == "native"


def test_registering_an_unknown_op_names_the_known_ones():
    with pytest.raises(CustomOpError) as info:
        CustomOpRegistry().register("cpu", "rms_nrom", lambda layer, x: x)
    message = str(info.value)
    assert "'rms_nrom'" in message
    for name in ("rms_norm", "rotary_embedding", "silu_and_mul"):
        assert name in message


# -- declaring CustomOp subclasses -----------------------------------------------------


def test_subclass_without_op_name_is_rejected(op_classes):
    before = dict(op_classes)
    with pytest.raises(CustomOpError, match=r"Nameless must set the class attribute op_name"):

        class Nameless(CustomOp):
            def forward_native(self, x: torch.Tensor) -> torch.Tensor:
                return x

    assert op_classes == before
    assert issubclass(CustomOpError, ValueError)


def test_op_name_taken_by_another_class_is_rejected(op_classes):
    with pytest.raises(CustomOpError) as info:

        class MyNorm(CustomOp):
            op_name = "rms_norm"

            def forward_native(self, x: torch.Tensor) -> torch.Tensor:
                return x

    message = str(info.value)
    assert "'rms_norm'" in message and "RMSNorm" in message and "MyNorm" in message
    assert op_classes["rms_norm"] is RMSNorm


def test_subclass_of_an_op_must_choose_its_own_op_name(op_classes):
    with pytest.raises(CustomOpError, match="choose another op_name"):

        class GemmaNorm(RMSNorm):
            pass

    class GemmaNormNamed(RMSNorm):
        op_name = "custom_ops_test_gemma_norm"

    assert op_classes["custom_ops_test_gemma_norm"] is GemmaNormNamed
    assert op_classes["rms_norm"] is RMSNorm


def define_in_module(module_name: str, class_name: str, op_name: str) -> type[CustomOp]:
    """Define ``class_name`` in a fresh module called ``module_name``, like an import."""
    module = types.ModuleType(module_name)
    source = (
        "from slotwise.custom_op import CustomOp\n"
        f"class {class_name}(CustomOp):\n"
        f"    op_name = {op_name!r}\n"
        "    def forward_native(self, x):\n"
        "        return x\n"
    )
    exec(compile(source, f"<{module_name}>", "exec"), module.__dict__)
    return getattr(module, class_name)


def test_redefining_the_same_class_as_a_module_reload_does_is_allowed(op_classes):
    first = define_in_module("custom_ops_test_reloaded", "Reloaded", "custom_ops_test_reload")
    second = define_in_module("custom_ops_test_reloaded", "Reloaded", "custom_ops_test_reload")
    assert first is not second
    assert op_classes["custom_ops_test_reload"] is second


def test_same_class_name_in_another_module_cannot_take_over_an_op_name(op_classes):
    try:
        define_in_module("some_vendor_package.layers", "RMSNorm", "rms_norm")
    except CustomOpError:
        pass
    assert op_classes["rms_norm"] is RMSNorm


def test_the_core_op_catalogue_names_exactly_the_ops_of_slotwise_layers():
    import slotwise.layers  # noqa: F401 - defines them

    defined = {
        name
        for name, cls in CustomOp.op_classes.items()
        if cls.__module__.startswith("slotwise.layers")
    }
    assert defined == CORE_OP_NAMES


def test_the_conformance_suite_checks_every_core_op():
    from slotwise.testing.conformance.test_custom_ops import BUILDERS

    assert set(BUILDERS) == CORE_OP_NAMES
