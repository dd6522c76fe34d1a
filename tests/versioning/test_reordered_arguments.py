"""``CustomOpRegistry.register`` took ``(op_name, platform, implementation)`` up to API
1.4 and takes the platform first from 1.5, as the attention-backend registry does. A
plugin calling it the old way keeps working, with a ``DeprecationWarning`` at its call,
wherever the old order can be told apart from the new one."""

from __future__ import annotations

import inspect
import json
import warnings

import pytest

from slotwise import api_versioning
from slotwise.custom_op import CustomOpError, CustomOpRegistry


def replacement(layer, x, residual=None):
    return x


def deprecations(record: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, DeprecationWarning)]


def test_the_table_names_the_current_order():
    old, new, deprecated_in = api_versioning.REORDERED_ARGUMENTS["CustomOpRegistry.register"]
    parameters = list(inspect.signature(CustomOpRegistry.register).parameters)[1:]
    assert [part.split("=")[0].strip() for part in new.split(",")] == parameters
    assert old.split(", ")[:2] == ["op_name", "platform"]
    assert deprecated_in == "1.5"


def test_the_old_order_registers_the_same_replacement_and_warns_at_the_call():
    registry = CustomOpRegistry()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        registry.register("rms_norm", "npu", replacement)
    assert registry.entries() == [("rms_norm", "npu")]
    assert registry.lookup("rms_norm", "npu") is replacement
    [warning] = deprecations(record)
    message = str(warning.message)
    assert "deprecated in slotwise API 1.5" in message
    assert "write register('npu', 'rms_norm', ...)" in message
    assert "(platform_name, op_name, implementation, priority=0)" in message
    assert "stops working in API 2.0" in message
    assert warning.filename == __file__  # the plugin's line, where its author must act


def test_the_new_order_does_not_warn():
    registry = CustomOpRegistry()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.register("npu", "rms_norm", replacement, priority=2)
    assert registry.entries() == [("rms_norm", "npu")]


def test_an_old_order_call_with_a_misspelt_op_fails_naming_the_new_order():
    # Neither argument is an op, so the new order is read: the op name "npu" is unknown.
    with pytest.raises(CustomOpError) as caught:
        CustomOpRegistry().register("rms_nrom", "npu", replacement)
    message = str(caught.value)
    assert "unknown custom op 'npu' on platform 'rms_nrom'" in message
    assert "call registry.register(platform_name, op_name, implementation, priority=0)" in message


OLD_ORDER_PLUGIN = """
    from slotwise.plugin_api import hookimpl

    def sevens(layer, x, residual=None):
        return layer.forward_native(x, residual) * 0 + 7

    @hookimpl
    def slotwise_register_custom_ops(registry):
        registry.register("rms_norm", "cpu", sevens)  # the order of API 1.0-1.4
"""


@pytest.mark.slow
def test_a_plugin_written_for_the_old_order_still_replaces_the_op(dists):
    dists.add("slotwise-oldorder", OLD_ORDER_PLUGIN)
    result = dists.run(
        """
        import json, warnings
        warnings.simplefilter("always", DeprecationWarning)
        import torch
        from slotwise.layers import RMSNorm

        layer = RMSNorm(8)
        print(json.dumps({"implementation": layer.implementation,
                          "out": layer(torch.ones(1, 8)).tolist()}))
        """,
        SLOTWISE_PLATFORM="cpu",
        SLOTWISE_COMPILATION_CONFIG=json.dumps({"backend": "eager"}),
        SLOTWISE_STRICT_PLUGINS="1",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {"implementation": "plugin", "out": [[7.0] * 8]}
    assert "slotwise_oldorder.py" in result.stderr and "DeprecationWarning" in result.stderr
    assert "write register('cpu', 'rms_norm', ...)" in result.stderr
