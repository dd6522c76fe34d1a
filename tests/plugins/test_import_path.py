"""``"module:attr"`` import paths: one syntax and one resolver for every place that takes them.

Platforms, attention backends, custom-op replacements and compiler backends all name
code this way; each keeps its own error type, and every message names what was being
loaded, the path, the part that failed and the fix.
"""

from __future__ import annotations

import collections
import os.path
from collections.abc import Callable

import pytest

import slotwise.layers  # noqa: F401 - defines the custom op rms_norm
from slotwise.attention.registry import AttentionBackendError, AttentionBackendRegistry
from slotwise.compilation.compilers import make_compiler
from slotwise.compilation.config import CompilationConfig, ConfigError
from slotwise.custom_op import CustomOpError, CustomOpRegistry
from slotwise.import_path import check_import_path, resolve_import_path
from slotwise.platforms import PlatformSpec
from slotwise.platforms.errors import PlatformError
from slotwise.platforms.resolution import PlatformEntry, instantiate
from slotwise.plugins.manager import PluginRecord

FIX = "give 'pkg.module:Name'"


class Oops(Exception):
    """Stands in for a caller's own error type."""


@pytest.mark.parametrize("text", ["pkg:Name", "pkg.sub_1:Outer.Inner", "_p:_n"])
def test_valid_paths_pass_unchanged(text):
    assert check_import_path(text, "thing", fix=FIX) == text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("pkg.Name", "no ':' between the module and the attribute"),
        (":Name", "the module before ':'"),
        ("1pkg:Name", "the module before ':'"),
        ("pkg..sub:Name", "the module before ':'"),
        ("pkg:", "the attribute after ':'"),
        ("pkg:Name:more", "the attribute after ':'"),
        ("pkg:Na me", "the attribute after ':'"),
        ("", "no ':'"),
    ],
)
def test_a_malformed_path_names_what_the_path_the_bad_part_and_the_fix(text, problem):
    with pytest.raises(Oops) as caught:
        check_import_path(text, "vendor thing", fix=FIX, error=Oops)
    message = str(caught.value)
    assert message.startswith(f"vendor thing: got {text!r}")
    assert problem in message and message.endswith(FIX)


def test_a_value_that_is_no_string_is_named_by_its_type():
    with pytest.raises(ValueError, match=r"thing: got int, not a 'module:attr' string"):
        check_import_path(5, "thing", fix=FIX)


def test_a_huge_value_is_cut_in_the_message():
    with pytest.raises(ValueError) as caught:
        check_import_path("x" * 10**6, "thing", fix=FIX)
    assert len(str(caught.value)) < 500


def test_resolve_returns_the_named_object():
    assert resolve_import_path("os.path:join", what="t", fix=FIX) is os.path.join
    found = resolve_import_path("collections:OrderedDict", what="t", fix=FIX, expected_type=dict)
    assert found is collections.OrderedDict


def test_a_module_that_is_missing_or_fails_to_import_is_named(tmp_path, monkeypatch):
    with pytest.raises(Oops) as caught:
        resolve_import_path("no_such_module_xyz:Name", what="thing", fix=FIX, error=Oops)
    message = str(caught.value)
    assert "thing: cannot import module 'no_such_module_xyz'" in message
    assert "ModuleNotFoundError" in message and message.endswith(FIX)
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)

    (tmp_path / "exploding_module_xyz.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(Oops, match=r"cannot import module 'exploding_module_xyz'.*boom"):
        resolve_import_path("exploding_module_xyz:Name", what="thing", fix=FIX, error=Oops)


def test_a_missing_attribute_is_named_up_to_the_part_that_failed():
    with pytest.raises(Oops) as caught:
        resolve_import_path("collections:OrderedDict.nope.deeper", what="t", fix=FIX, error=Oops)
    assert "cannot get 'OrderedDict.nope' from module 'collections'" in str(caught.value)


def test_an_object_of_the_wrong_type_is_rejected():
    with pytest.raises(Oops, match=r"is <function .*not a subclass of builtins.dict"):
        resolve_import_path("os.path:join", what="t", fix=FIX, expected_type=dict, error=Oops)


def _instantiate_platform(path: str) -> object:
    spec = PlatformSpec("vendor", path, lambda: True)
    return instantiate(PlatformEntry(spec, PluginRecord(name="vendor", value="vendor")))


def _load_backend(path: str) -> object:
    registry = AttentionBackendRegistry()
    registry.register("npu", path)
    return registry.entries()[0].load()


def _look_up_replacement(path: str) -> object:
    registry = CustomOpRegistry()
    registry.register("cpu", "rms_norm", path)
    return registry.lookup("rms_norm", "cpu")


def _make_compiler(path: str) -> object:
    return make_compiler(path, CompilationConfig())


@pytest.mark.parametrize(
    ("check", "error", "what"),
    [
        (lambda path: PlatformSpec("vendor", path, lambda: True), ValueError, "platform_cls"),
        (lambda path: AttentionBackendRegistry().register("npu", path), ValueError, "'npu'"),
        (
            lambda path: CustomOpRegistry().register("cpu", "rms_norm", path),
            CustomOpError,
            "replacement for custom op 'rms_norm'",
        ),
        (lambda path: CompilationConfig(backend=path), ConfigError, "'backend'"),
        (_make_compiler, ConfigError, "'backend'"),
    ],
)
def test_every_caller_rejects_a_malformed_path_with_its_own_error(
    check: Callable[[str], object], error: type[Exception], what: str
):
    with pytest.raises(error) as caught:
        check("pkg:Na me")
    message = str(caught.value)
    assert what in message and "'pkg:Na me'" in message and "the attribute after ':'" in message


LOADERS = [
    (_instantiate_platform, PlatformError, "platform 'vendor' from plugin 'vendor'"),
    (_load_backend, AttentionBackendError, "attention backend for platform 'npu'"),
    (_look_up_replacement, CustomOpError, "replacement for custom op 'rms_norm'"),
    (_make_compiler, ConfigError, "compilation config key 'backend'"),
]


@pytest.mark.parametrize(("load", "error", "what"), LOADERS)
def test_every_loader_reports_a_failed_import_with_its_own_error(
    load: Callable[[str], object], error: type[Exception], what: str
):
    with pytest.raises(error) as caught:
        load("no_such_module_xyz:Name")
    assert str(caught.value).startswith(f"{what}")
    assert "cannot import module 'no_such_module_xyz'" in str(caught.value)


@pytest.mark.parametrize(("load", "error", "what"), LOADERS[:2] + LOADERS[3:])
def test_loaders_of_classes_reject_an_object_of_the_wrong_type(
    load: Callable[[str], object], error: type[Exception], what: str
):
    with pytest.raises(error, match=r"'os.path:join' is <function .*not a subclass of"):
        load("os.path:join")
