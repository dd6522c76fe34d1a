"""Choosing an attention backend: the name asked for, else priority and requirements.

Backends here are classes defined by the tests; the bundled plugins appear only as
installed plugins do, through their entry points and backend names (each plugin's own
tests check its backend's facts).
"""

from __future__ import annotations

import pytest
import torch

from slotwise.attention import (
    AttentionBackend,
    AttentionBackendError,
    AttentionBackendRegistry,
    AttentionImpl,
    get_attention_backend_registry,
    select_attention_backend,
)
from slotwise.attention.registry import UnknownAttentionBackendError
from slotwise.platforms import get_current_platform

FP16_ONLY = (torch.float16,)


def backend(name: str, **attributes: object) -> type[AttentionBackend]:
    """A backend class named ``name`` with the given class attributes."""
    methods = {
        "get_name": classmethod(lambda cls: name),
        "get_impl_cls": classmethod(lambda cls: AttentionImpl),
    }
    return type(name.title(), (AttentionBackend,), {**methods, **attributes})


WIDE = backend("WIDE")
NARROW = backend("NARROW", supported_head_sizes=(64, 128), supported_dtypes=FP16_ONLY)
BLOCKY = backend("BLOCKY", supported_block_sizes=(128,))
FP16 = {"head_size": 64, "dtype": torch.float16, "block_size": 16}


@pytest.fixture(autouse=True)
def no_env_override(monkeypatch):
    monkeypatch.delenv("SLOTWISE_ATTENTION_BACKEND", raising=False)


def registry(*entries: tuple[str, type[AttentionBackend] | str, int]) -> AttentionBackendRegistry:
    made = AttentionBackendRegistry()
    for platform, cls, priority in entries:
        made.register(platform, cls, priority=priority)
    return made


def test_highest_priority_backend_that_fits_wins():
    reg = registry(("npu", WIDE, 0), ("npu", NARROW, 10))
    assert select_attention_backend("npu", registry=reg, **FP16) is NARROW
    fp32 = {**FP16, "dtype": torch.float32}
    assert select_attention_backend("npu", registry=reg, **fp32) is WIDE


def test_equal_priorities_keep_registration_order():
    reg = registry(("npu", BLOCKY, 5), ("npu", NARROW, 5), ("npu", WIDE, 5))
    assert select_attention_backend("npu", registry=reg, **FP16) is NARROW


def test_env_variable_overrides_priority_case_insensitively(monkeypatch):
    reg = registry(("npu", WIDE, 0), ("npu", NARROW, 10))
    monkeypatch.setenv("SLOTWISE_ATTENTION_BACKEND", "wide")
    assert select_attention_backend("npu", registry=reg, **FP16) is WIDE


def test_selected_argument_beats_the_env_variable(monkeypatch):
    reg = registry(("npu", WIDE, 0), ("npu", NARROW, 10))
    monkeypatch.setenv("SLOTWISE_ATTENTION_BACKEND", "NARROW")
    assert select_attention_backend("npu", "WIDE", registry=reg, **FP16) is WIDE


def test_unknown_name_lists_the_platforms_backends_and_the_others(monkeypatch):
    reg = registry(("npu", WIDE, 0), ("npu", NARROW, 0), ("gpu", BLOCKY, 0))
    monkeypatch.setenv("SLOTWISE_ATTENTION_BACKEND", "FLASH")
    with pytest.raises(UnknownAttentionBackendError) as error:
        select_attention_backend("npu", registry=reg, **FP16)
    message = str(error.value)
    assert message.startswith(
        "SLOTWISE_ATTENTION_BACKEND=FLASH: unknown attention backend name 'FLASH' for "
        "platform 'npu'; known: WIDE, NARROW; "
    )
    assert "BLOCKY (gpu)" in message
    assert "set SLOTWISE_ATTENTION_BACKEND to a known name" in message
    # Not a misfit of the layer: callers that suggest another dtype let it through.
    assert not isinstance(error.value, AttentionBackendError)


def test_an_unknown_selected_name_says_what_to_pass():
    reg = registry(("npu", WIDE, 0))
    with pytest.raises(UnknownAttentionBackendError) as error:
        select_attention_backend("npu", "FLASH", registry=reg, **FP16)
    message = str(error.value)
    assert message.startswith("selected=FLASH: unknown attention backend name 'FLASH'")
    assert "known: WIDE; pass a known name, or pass selected=None" in message


def test_named_backend_that_does_not_fit_gives_its_reasons(monkeypatch):
    reg = registry(("npu", WIDE, 0), ("npu", NARROW, 0))
    monkeypatch.setenv("SLOTWISE_ATTENTION_BACKEND", "NARROW")
    with pytest.raises(AttentionBackendError) as error:
        select_attention_backend("npu", registry=reg, head_size=80, dtype=torch.float32)
    message = str(error.value)
    assert "NARROW" in message and "SLOTWISE_ATTENTION_BACKEND" in message
    assert "head size 80 not in (64, 128)" in message
    assert "dtype torch.float32 not in (torch.float16)" in message


def test_no_fit_lists_every_backend_and_why_it_was_rejected():
    reg = registry(
        ("npu", NARROW, 2),
        ("npu", BLOCKY, 1),
        ("npu", "no_such_module_xyz:Backend", 0),
    )
    with pytest.raises(AttentionBackendError) as error:
        select_attention_backend("npu", registry=reg, head_size=80, block_size=16)
    lines = str(error.value).splitlines()
    assert "platform 'npu'" in lines[0] and "head_size=80" in lines[0]
    assert lines[1].strip().startswith("NARROW") and "head size 80 not in" in lines[1]
    assert lines[2].strip().startswith("BLOCKY") and "block size 16 not in (128)" in lines[2]
    assert lines[3].strip().startswith("no_such_module_xyz:Backend: ")
    assert "cannot import module 'no_such_module_xyz'" in lines[3]
    assert "ModuleNotFoundError" in lines[3]


def test_platform_without_backends_says_so():
    with pytest.raises(AttentionBackendError, match="no attention backend is registered"):
        select_attention_backend("npu", registry=registry(("gpu", WIDE, 0)), **FP16)


def test_unknown_requirements_are_ignored():
    reg = registry(("npu", WIDE, 0))
    assert select_attention_backend("npu", registry=reg, sliding_window=128, **FP16) is WIDE


@pytest.mark.parametrize(
    "args, error",
    [
        (("npu", "not a class path"), AttentionBackendError),
        (("npu", int), AttentionBackendError),
        (("npu", WIDE, True), AttentionBackendError),
    ],
)
def test_registration_rejects_what_it_cannot_load(args, error):
    with pytest.raises(error):
        AttentionBackendRegistry().register(*args)


def test_string_registration_that_is_not_a_backend_is_rejected_on_selection():
    reg = registry(("npu", "slotwise.attention:AttentionMetadataBuilder", 0))
    with pytest.raises(AttentionBackendError, match="not a subclass of"):
        select_attention_backend("npu", registry=reg, **FP16)


def test_bundled_plugins_register_their_backends_by_class_path():
    labels = {(e.platform, e.label) for e in get_attention_backend_registry().entries()}
    assert ("cpu", "slotwise_cpu.attention:CpuSdpaBackend") in labels
    assert ("cuda", "slotwise_cuda.attention:TritonPagedBackend") in labels
    assert ("ascend_stub", "slotwise_ascend_stub.attention:AscendStubReferenceBackend") in labels


@pytest.mark.parametrize(
    "platform, expected",
    [("cpu", "CPU_SDPA"), ("cuda", "TRITON_PAGED"), ("ascend_stub", "ASCEND_STUB_REFERENCE")],
)
def test_each_bundled_platform_picks_its_backend(platform, expected):
    chosen = select_attention_backend(
        platform, head_size=80, dtype=torch.bfloat16, block_size=8, future_requirement=1
    )
    assert chosen.get_name() == expected


def test_current_platform_picks_cpu_sdpa_here():
    if get_current_platform().name != "cpu":
        pytest.skip("the current platform is not the CPU")
    assert select_attention_backend(get_current_platform(), head_size=64).get_name() == "CPU_SDPA"


PLUGIN_WITH_BACKEND = """
    from slotwise.plugins import hookimpl

    CALLS = []

    @hookimpl
    def slotwise_register_attention_backends(registry):
        CALLS.append(1)
        registry.register("cpu", "fastcpu_backend:FastCpuBackend", priority=10)
"""
FAST_CPU_BACKEND = """
import torch
from slotwise.attention import AttentionBackend, AttentionImpl

class FastCpuBackend(AttentionBackend):
    supported_head_sizes = (64, 128)

    @classmethod
    def get_name(cls):
        return "FAST_CPU"

    @classmethod
    def get_impl_cls(cls):
        return AttentionImpl
"""
BROKEN_HOOK = """
    from slotwise.plugins import hookimpl

    @hookimpl
    def slotwise_register_attention_backends(registry):
        raise RuntimeError("backend hook exploded")
"""
SELECT = """
import torch
import slotwise
import slotwise_fastcpu
from slotwise.attention.selector import select_attention_backend
from slotwise.platforms import get_current_platform
platform = get_current_platform()
for head_size in (64, 80, 128):
    print(select_attention_backend(platform, head_size=head_size).get_name())
print("hook calls:", len(slotwise_fastcpu.CALLS))
"""


def test_a_plugin_adds_a_backend_to_another_plugins_platform(dists):
    dists.add("slotwise-fastcpu", PLUGIN_WITH_BACKEND)
    (dists.root / "fastcpu_backend.py").write_text(FAST_CPU_BACKEND)
    result = dists.run(SELECT, SLOTWISE_PLATFORM="cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:4] == ["FAST_CPU", "CPU_SDPA", "FAST_CPU", "hook calls: 1"]
    forced = dists.run(SELECT, SLOTWISE_PLATFORM="cpu", SLOTWISE_ATTENTION_BACKEND="CPU_SDPA")
    assert forced.stdout.split("\n")[:3] == ["CPU_SDPA"] * 3, forced.stderr


def test_a_broken_backend_hook_fails_its_plugin_only(dists):
    dists.add("slotwise-fastcpu", PLUGIN_WITH_BACKEND)
    dists.add("slotwise-broken", BROKEN_HOOK, version="0.2")
    (dists.root / "fastcpu_backend.py").write_text(FAST_CPU_BACKEND)
    result = dists.run(SELECT, SLOTWISE_PLATFORM="cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["FAST_CPU", "CPU_SDPA", "FAST_CPU"]
    assert "slotwise-broken" in result.stderr and "backend hook exploded" in result.stderr


HALF_REGISTERED = """
    from slotwise.plugins import hookimpl

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register("cpu", "fastcpu_backend:FastCpuBackend", priority=10)
        raise RuntimeError("half-way")
"""
TYPO = """
    from slotwise.plugins import hookimpl

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register("cpu", "no_such_module_xyz:Backend", priority=20)
"""
LOAD_EACH = """
from slotwise.attention.registry import AttentionBackendError, get_attention_backend_registry
for entry in get_attention_backend_registry().entries("cpu"):
    try:
        print(entry.load().get_name())
    except AttentionBackendError as exc:
        print(exc)
"""


def test_a_plugin_failing_half_way_leaves_no_backend_and_a_broken_one_names_its_plugin(dists):
    dists.add("slotwise-half", HALF_REGISTERED)
    dists.add("slotwise-typo", TYPO, version="0.3")
    (dists.root / "fastcpu_backend.py").write_text(FAST_CPU_BACKEND)
    result = dists.run(LOAD_EACH, SLOTWISE_PLATFORM="cpu")
    assert result.returncode == 0, result.stderr
    typo, *others = result.stdout.splitlines()
    assert others == ["CPU_SDPA"]  # nothing of slotwise-half
    assert typo.startswith("attention backend for platform 'cpu' from plugin 'slotwise_typo'")
    assert "slotwise-typo 0.3" in typo and "cannot import module 'no_such_module_xyz'" in typo


SELECT_TWICE = """
from slotwise.attention.selector import select_attention_backend
import torch
for _ in range(2):
    chosen = select_attention_backend("cpu", head_size=64, dtype=torch.float32, block_size=16)
    print(chosen.get_name())
"""


def test_a_broken_higher_priority_backend_passed_over_is_warned_about_once(dists):
    dists.add("slotwise-typo", TYPO, version="0.3")
    result = dists.run(SELECT_TWICE, SLOTWISE_PLATFORM="cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CPU_SDPA", "CPU_SDPA"]
    warnings = [line for line in result.stderr.splitlines() if "in place of" in line]
    assert len(warnings) == 1, result.stderr
    assert "CPU_SDPA" in warnings[0] and "no_such_module_xyz" in warnings[0]
