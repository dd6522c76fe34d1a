"""Replacements registered by plugins through real entry points, each case in a fresh
process: a plugin changes what RMSNorm runs on its platform without any change to model
code, a plugin that names an unknown op is skipped with a warning, and a replacement
given as ``"module:function"`` is imported only when a layer needs it.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

#: Replaces RMSNorm on the cpu platform by a function that returns sevens and logs calls.
SEVENS_PLUGIN = """
    from slotwise.plugins import hookimpl

    CALLS = []

    def sevens(layer, x, residual=None):
        CALLS.append(list(x.shape))
        return layer.forward_native(x, residual) * 0 + 7

    @hookimpl
    def slotwise_register_custom_ops(registry):
        registry.register("cpu", "rms_norm", sevens)
"""

#: Prints, as JSON, what RMSNorm(8) runs on the cpu platform and what it returns.
BUILD_AND_RUN = """
    import json
    import torch
    from slotwise.layers import RMSNorm

    layer = RMSNorm(8)
    out = layer(torch.randn(2, 8))
    print(json.dumps({"implementation": layer.implementation, "out": out.tolist()}))
"""

EAGER = json.dumps({"backend": "eager"})


def run_json(dists, code: str, **env: str) -> dict:
    env = {"SLOTWISE_PLATFORM": "cpu", "SLOTWISE_COMPILATION_CONFIG": EAGER, **env}
    result = dists.run(code, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_replacement_runs_without_any_change_to_model_code(dists):
    dists.add("slotwise-sevens", SEVENS_PLUGIN)
    report = run_json(
        dists,
        """
        import json
        import torch
        from slotwise.layers import RMSNorm

        layer = RMSNorm(8)
        out = layer(torch.randn(2, 8))
        import slotwise_sevens  # the plugin's module, loaded by plugin discovery

        print(json.dumps({
            "implementation": layer.implementation,
            "out": out.tolist(),
            "calls": slotwise_sevens.CALLS,
        }))
        """,
    )
    assert report["implementation"] == "plugin"
    assert report["out"] == [[7.0] * 8] * 2
    assert report["calls"] == [[2, 8]]


def test_reference_model_picks_up_the_replacement(dists):
    dists.add("slotwise-sevens", SEVENS_PLUGIN)
    report = run_json(
        dists,
        """
        import json
        from slotwise.layers import RMSNorm, SiluAndMul
        from slotwise_engine.models.llama import build_llama

        model = build_llama("tiny", compilation_config={"level": 0})
        print(json.dumps({
            type(m).__name__ + "/" + m.implementation: True
            for m in model.modules() if isinstance(m, (RMSNorm, SiluAndMul))
        }))
        """,
    )
    assert report == {"RMSNorm/plugin": True, "SiluAndMul/native": True}


def test_without_the_plugin_the_cpu_platform_runs_forward_cpu(dists):
    assert run_json(dists, BUILD_AND_RUN)["implementation"] == "cpu"


@pytest.mark.parametrize(
    "config",
    [
        {"backend": "eager", "custom_ops": ["-rms_norm"]},
        {"backend": "eager", "custom_ops": ["none"]},
        {"level": 3, "backend": "inductor"},
        {},  # level 3 with the cpu platform's default backend, Inductor
    ],
    ids=["minus_rms_norm", "none", "level3_inductor", "default"],
)
def test_custom_ops_setting_turns_the_replacement_off(dists, config):
    dists.add("slotwise-sevens", SEVENS_PLUGIN)
    report = run_json(dists, BUILD_AND_RUN, SLOTWISE_COMPILATION_CONFIG=json.dumps(config))
    assert report["implementation"] == "native"
    assert report["out"] != [[7.0] * 8] * 2


TYPO_PLUGIN = """
    from slotwise.plugins import hookimpl

    @hookimpl
    def slotwise_register_custom_ops(registry):
        registry.register("cpu", "rms_nrom", lambda layer, x, residual=None: x)
"""

REPORT = """
    from slotwise.platforms import plugin_report
    print(json.dumps({r.name: [r.status, r.reason] for r in plugin_report()}))
"""


def test_unknown_op_name_fails_that_plugin_with_one_warning_and_others_still_work(dists):
    dists.add("slotwise-typo", TYPO_PLUGIN, version="0.4")
    dists.add("slotwise-sevens", SEVENS_PLUGIN)
    result = dists.run(
        BUILD_AND_RUN + REPORT, SLOTWISE_PLATFORM="cpu", SLOTWISE_COMPILATION_CONFIG=EAGER
    )
    assert result.returncode == 0, result.stderr
    built, report = (json.loads(line) for line in result.stdout.splitlines()[-2:])
    assert built["implementation"] == "plugin"
    assert built["out"] == [[7.0] * 8] * 2
    warnings = [line for line in result.stderr.splitlines() if "slotwise-typo" in line]
    assert len(warnings) == 1, result.stderr
    for expected in ("0.4", "rms_nrom", "rms_norm, rotary_embedding, silu_and_mul"):
        assert expected in warnings[0]
    assert report["slotwise_typo"][0] == "failed"
    assert "rms_nrom" in report["slotwise_typo"][1]
    assert report["slotwise_sevens"][0] == "loaded"


def test_strict_plugins_turn_an_unknown_op_name_into_an_error(dists):
    dists.add("slotwise-typo", TYPO_PLUGIN)
    result = dists.run(
        BUILD_AND_RUN,
        SLOTWISE_PLATFORM="cpu",
        SLOTWISE_COMPILATION_CONFIG=EAGER,
        SLOTWISE_STRICT_PLUGINS="1",
    )
    assert result.returncode != 0
    assert "PluginError" in result.stderr
    assert "slotwise-typo" in result.stderr and "rms_nrom" in result.stderr


def test_a_failed_plugin_leaves_no_replacement_behind(dists):
    dists.add(
        "slotwise-half",
        """
        from slotwise.plugins import hookimpl

        @hookimpl
        def slotwise_register_custom_ops(registry):
            registry.register("cpu", "rms_norm", lambda layer, x, residual=None: x * 0 + 7)
            registry.register("cpu", "rms_nrom", lambda layer, x, residual=None: x)
        """,
    )
    result = dists.run(
        BUILD_AND_RUN + REPORT, SLOTWISE_PLATFORM="cpu", SLOTWISE_COMPILATION_CONFIG=EAGER
    )
    assert result.returncode == 0, result.stderr
    built, report = (json.loads(line) for line in result.stdout.splitlines()[-2:])
    assert report["slotwise_half"][0] == "failed"
    assert built["implementation"] == "cpu"


LAZY_PLUGIN = """
    from slotwise.plugins import hookimpl

    @hookimpl
    def slotwise_register_custom_ops(registry):
        registry.register("cpu", "rms_norm", "slotwise_lazy_impl:rms_norm")
        registry.register("cuda", "silu_and_mul", "slotwise_lazy_never:silu_and_mul")
"""

LAZY_IMPL = """
def rms_norm(layer, x, residual=None):
    return layer.forward_native(x, residual) * 0 + 7
"""


def test_replacement_given_as_a_string_is_imported_only_when_a_layer_needs_it(dists):
    dists.add("slotwise-lazy", LAZY_PLUGIN)
    (dists.root / "slotwise_lazy_impl.py").write_text(LAZY_IMPL)
    (dists.root / "slotwise_lazy_never.py").write_text("raise ImportError('imported')\n")
    report = run_json(
        dists,
        """
        import json
        import sys
        import torch
        from slotwise.custom_op import get_custom_op_registry
        from slotwise.layers import RMSNorm, SiluAndMul

        entries = get_custom_op_registry().entries()
        registered = "slotwise_lazy_impl" in sys.modules
        norm, act = RMSNorm(8), SiluAndMul()
        built = "slotwise_lazy_impl" in sys.modules
        print(json.dumps({
            "entries": entries,
            "imported_at_registration": registered,
            "imported_at_construction": built,
            "never_imported": "slotwise_lazy_never" not in sys.modules,
            "implementations": [norm.implementation, act.implementation],
            "out": norm(torch.randn(2, 8)).tolist(),
        }))
        """,
    )
    assert ["rms_norm", "cpu"] in report["entries"]
    assert report["imported_at_registration"] is False
    assert report["imported_at_construction"] is True
    assert report["never_imported"] is True
    assert report["implementations"] == ["plugin", "native"]
    assert report["out"] == [[7.0] * 8] * 2
