"""Inductor on a device type it has no code generator for is refused before anything is
compiled, with one ConfigError naming the backend that works, instead of Inductor's bare
``KeyError`` from deep inside the first compile. Inductor's own registry
(``torch._inductor.codegen.common``) says which device types it can target; "meta" is
not one of them, which stands in for a vendor's device here."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch._dynamo.utils import counters as dynamo_counters

from slotwise.compilation.compile_counters import counters
from slotwise.compilation.compilers import check_inductor_targets
from slotwise.compilation.config import CompilationConfig, ConfigError
from slotwise.platforms import Platform, use_platform
from slotwise.testing.toy_models import SillyModel

REFUSED = (
    "compilation config key 'backend': 'inductor' cannot compile for platform 'nocodegen': "
    "Inductor has no code generator for its device type 'meta'"
)


class CpuDevice(Platform):
    """A vendor's platform on a device type Inductor can target, compiling with "eager"."""

    name = "nocodegen"
    device_type = "cpu"
    default_compile_backend = "eager"


class NoInductorDevice(CpuDevice):
    """A device Inductor cannot target, on a platform that compiles with "eager"."""

    device_type = "meta"


class InductorByDefault(NoInductorDevice):
    """The same device on a platform that names Inductor its default all the same."""

    default_compile_backend = "inductor"


@pytest.mark.parametrize("level", [1, 2, 3])
def test_inductor_is_refused_before_anything_is_compiled(level):
    with use_platform(NoInductorDevice()):
        model = SillyModel(
            compilation_config=CompilationConfig(
                level=level, backend="inductor", disable_cache=True
            )
        )
        before = counters.snapshot()
        graphs = dynamo_counters["stats"]["unique_graphs"]
        with pytest.raises(ConfigError) as refused:
            model(torch.randn(4, 8))
    assert str(refused.value) == (
        f"{REFUSED}; use the platform's default backend 'eager' (leave 'backend' unset, or "
        "-O.backend=eager)"
    )
    after = counters.snapshot()
    assert after["num_models_seen"] == before["num_models_seen"] + 1  # it was called
    assert {k: v for k, v in after.items() if k != "num_models_seen"} == {
        k: v for k, v in before.items() if k != "num_models_seen"
    }
    assert dynamo_counters["stats"]["unique_graphs"] == graphs  # nothing was even traced


def test_a_platform_naming_inductor_for_such_a_device_is_told_to_change_its_default():
    with pytest.raises(ConfigError) as refused:
        check_inductor_targets(InductorByDefault())
    message = str(refused.value)
    assert message.startswith(f"{REFUSED}, yet the platform ({__name__}.InductorByDefault)")
    assert "use backend 'eager' (-O.backend=eager)" in message
    assert "set default_compile_backend = 'eager' or register an Inductor backend" in message


def test_inductor_is_accepted_for_the_device_types_it_can_target():
    check_inductor_targets(CpuDevice())


@pytest.mark.slow
def test_bench_refuses_inductor_for_such_a_device_in_one_line_before_building_a_model(dists):
    dists.add(
        "slotwise-nocodegen",
        """
        from slotwise.plugin_api import Platform, PlatformSpec, hookimpl

        class NoCodegenPlatform(Platform):
            name = "nocodegen"
            device_type = "meta"
            default_compile_backend = "eager"

        @hookimpl
        def slotwise_platforms():
            return [PlatformSpec("nocodegen", __name__ + ":NoCodegenPlatform", lambda: True)]
        """,
    )
    result = dists.run(
        textwrap.dedent(
            """
            from slotwise.cli.main import main
            raise SystemExit(main(["bench", "--preset", "tiny", "-O.backend=inductor"]))
            """
        ),
        SLOTWISE_PLATFORM="nocodegen",
        SLOTWISE_DISABLE_COMPILE_CACHE="1",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.endswith(
        f"slotwise bench: {REFUSED}; use the platform's default backend 'eager' (leave "
        "'backend' unset, or -O.backend=eager)\n"
    ), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
