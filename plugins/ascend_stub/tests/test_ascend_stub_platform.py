"""The stub NPU platform and its probe: both follow SLOTWISE_ASCEND_STUB_DEVICES."""

from __future__ import annotations

import pytest

from slotwise_ascend_stub.platform import AscendStubPlatform
from slotwise_ascend_stub.plugin import probe as ascend_probe


@pytest.mark.parametrize(
    "value, expected",
    [(None, "is not set"), ("0", "not a positive"), ("two", "not a positive"), ("2", True)],
)
def test_ascend_stub_is_available_only_with_its_device_variable(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("SLOTWISE_ASCEND_STUB_DEVICES", raising=False)
    else:
        monkeypatch.setenv("SLOTWISE_ASCEND_STUB_DEVICES", value)
    answer = ascend_probe()
    assert answer is True if expected is True else expected in answer


def test_ascend_stub_devices_follow_the_variable(monkeypatch):
    monkeypatch.setenv("SLOTWISE_ASCEND_STUB_DEVICES", "3")
    npu = AscendStubPlatform()
    assert npu.device_count() == 3
    assert npu.device_control_env_var == "SLOTWISE_ASCEND_STUB_DEVICES"
    graph_api = npu.get_graph_api()
    assert graph_api is not None and npu.get_graph_api() is graph_api  # one pool per process
    with pytest.raises(ValueError, match="SLOTWISE_ASCEND_STUB_DEVICES=3"):
        npu.set_device(3)
