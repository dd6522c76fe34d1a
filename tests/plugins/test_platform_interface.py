"""The Platform base class and PlatformSpec, as a plugin author meets them."""

from __future__ import annotations

import pytest

from slotwise.platforms import Platform, PlatformSpec


class MinimalPlatform(Platform):
    name = "minimal"
    device_type = "cpu"


def test_subclass_setting_only_name_and_device_type_instantiates():
    platform = MinimalPlatform()
    assert platform.get_graph_api() is None  # no static graphs
    assert platform.get_piecewise_backend_cls() is None  # slotwise's piecewise backend


@pytest.mark.parametrize(
    "method, args",
    [
        ("device_count", ()),
        ("get_device_name", (0,)),
        ("get_device_capability", (0,)),
        ("total_memory", (0,)),
        ("current_memory_usage", ()),
        ("set_device", (0,)),
        ("synchronize", ()),
    ],
)
def test_unimplemented_method_names_itself_and_the_platform(method, args):
    with pytest.raises(NotImplementedError, match=rf"'minimal' .*{method}\(\)"):
        getattr(MinimalPlatform(), method)(*args)


def test_methods_tolerate_unknown_keyword_arguments():
    class Counting(MinimalPlatform):
        def device_count(self, **kwargs):
            return 3

    assert Counting().device_count(future_requirement=True) == 3
    assert MinimalPlatform().get_graph_api(new_option=1) is None


def test_default_communicator_runs_on_torch_distributed():
    from slotwise.distributed import Communicator
    from slotwise.distributed.communicator import communicator_class

    assert MinimalPlatform().get_communicator_cls() is None
    assert communicator_class(MinimalPlatform()) is Communicator


def test_by_default_the_core_chooses_attention_backends_and_fills_in_configs():
    from slotwise.compilation import CompilationConfig

    platform, config = MinimalPlatform(), CompilationConfig()
    assert platform.get_attention_backend_cls(head_size=64) is None
    platform.check_and_update_config(config)
    assert config == CompilationConfig()


def test_subclass_without_name_is_rejected_with_the_missing_attributes():
    class Nameless(Platform):
        device_type = "cpu"

    with pytest.raises(TypeError, match="'name' and 'device_type'"):
        Nameless()


def probe() -> bool:
    return True


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "My Vendor"}, "lower-case"),
        ({"platform_cls": "no_colon.Class"}, "'module:Class'"),
        ({"probe": "yes"}, "callable"),
        ({"priority": "high"}, "int"),
        ({"requires_api": "1.0 or later"}, "PEP 440"),
    ],
)
def test_platform_spec_rejects_bad_fields_with_the_expected_form(kwargs, message):
    fields = {"name": "vendor", "platform_cls": "pkg.mod:Cls", "probe": probe}
    fields.update(kwargs)
    with pytest.raises((TypeError, ValueError), match=message):
        PlatformSpec(**fields)


@pytest.mark.parametrize(
    "requires_api, supported", [(">=1.0,<2", True), (">=1.1", False), ("~=1.0", True)]
)
def test_platform_spec_checks_the_api_version_with_pep440(requires_api, supported):
    spec = PlatformSpec("vendor", "pkg:Cls", probe, requires_api=requires_api)
    assert spec.supports_api("1.0") is supported
