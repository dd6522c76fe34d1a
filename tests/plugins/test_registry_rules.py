"""The two registries plugins fill, attention backends and custom-op replacements, keep
one set of rules: the platform first and ``priority`` last, the highest priority wins
and the first registered breaks a tie, a lazily named target that fails is not imported
again, and every error is a ``RegistryError`` naming the registration and the fix."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slotwise.attention.registry import AttentionBackendError, AttentionBackendRegistry
from slotwise.custom_op import CustomOpError, CustomOpRegistry
from slotwise.plugin_api import AttentionBackend, RegistryError
from slotwise.plugins.registration import own_platform


class FirstBackend(AttentionBackend):
    pass


class SecondBackend(AttentionBackend):
    pass


def first_rms_norm(layer, x, residual=None):
    return x


def second_rms_norm(layer, x, residual=None):
    return x


@dataclass
class Kind:
    """One registry, driven the same way: ``register(registry, platform, target, **kw)``
    and ``winner(registry, platform)``, the target that would be used there."""

    name: str
    new: Callable[..., Any]
    register: Callable[..., None]
    register_own: Callable[..., None]
    winner: Callable[[Any, str], Any]
    targets: tuple[Any, Any]
    error: type[RegistryError]


KINDS = [
    Kind(
        "attention",
        AttentionBackendRegistry,
        lambda registry, platform, target, **kw: registry.register(platform, target, **kw),
        lambda registry, target, **kw: registry.register_own(target, **kw),
        lambda registry, platform: registry.entries(platform)[0].load(),
        (FirstBackend, SecondBackend),
        AttentionBackendError,
    ),
    Kind(
        "custom_ops",
        CustomOpRegistry,
        lambda registry, platform, target, **kw: registry.register(
            platform, "rms_norm", target, **kw
        ),
        lambda registry, target, **kw: registry.register_own("rms_norm", target, **kw),
        lambda registry, platform: registry.lookup("rms_norm", platform),
        (first_rms_norm, second_rms_norm),
        CustomOpError,
    ),
]

each_registry = pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)


@each_registry
def test_the_platform_comes_first(kind):
    registry = kind.new()
    kind.register(registry, "npu", kind.targets[0])
    assert [platform for platform, _ in registry.registrations()] == ["npu"]
    assert kind.winner(registry, "npu") is kind.targets[0]


@each_registry
def test_the_highest_priority_wins_whatever_the_order(kind):
    low, high = kind.targets
    for order in ((low, 0), (high, 7)), ((high, 7), (low, 0)):
        registry = kind.new()
        for target, priority in order:
            kind.register(registry, "npu", target, priority=priority)
        assert kind.winner(registry, "npu") is high


@each_registry
def test_at_equal_priority_the_first_registered_wins_also_across_plugins(kind):
    merged = kind.new()
    for target in kind.targets:  # two plugins' registrations, merged as the hooks ran
        staged = kind.new(("npu",))
        kind.register_own(staged, target, priority=3)
        merged.merge(staged, f"plugin for {target.__name__}")
    assert kind.winner(merged, "npu") is kind.targets[0]


def test_a_tie_between_two_replacements_is_warned_about(caplog):
    merged = CustomOpRegistry()
    for source, target in zip(
        ("plugin 'a'", "plugin 'b'"), (first_rms_norm, second_rms_norm), strict=True
    ):
        staged = CustomOpRegistry(("npu",))
        staged.register_own("rms_norm", target)
        merged.merge(staged, source)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "replaced by both plugin 'a' and plugin 'b' at priority 0" in warning
    assert "the first registered (plugin 'a') wins" in warning
    assert "give the one that should win a higher priority" in warning


@pytest.fixture
def failing_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """``registry_rules_broken``: every import of it is recorded, then fails."""
    imports: list[str] = []
    monkeypatch.setattr(sys.modules[__name__], "IMPORTS", imports, raising=False)
    (tmp_path / "registry_rules_broken.py").write_text(
        f"import {__name__} as test\ntest.IMPORTS.append('imported')\nraise RuntimeError('boom')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield imports
    sys.modules.pop("registry_rules_broken", None)


@each_registry
def test_a_target_that_fails_to_import_fails_the_same_way_without_a_second_import(
    kind, failing_module
):
    registry = kind.new()
    kind.register(registry, "npu", "registry_rules_broken:Thing")
    errors = []
    for _ in range(2):
        with pytest.raises(kind.error) as caught:
            kind.winner(registry, "npu")
        errors.append(caught.value)
    assert failing_module == ["imported"]
    assert errors[0] is errors[1]
    message = str(errors[0])
    assert "for platform 'npu'" in message and "RuntimeError: boom" in message
    assert "fix or uninstall the plugin that registers it" in message


@each_registry
def test_a_target_that_cannot_be_called_is_refused_when_loaded(kind):
    registry = kind.new()
    kind.register(registry, "npu", "os:sep")
    with pytest.raises(kind.error, match="for platform 'npu'"):
        kind.winner(registry, "npu")


@each_registry
@pytest.mark.parametrize(
    "platform, target, priority, expected",
    [
        ("npu", "no colon here", 0, "not a 'module:attr' import path"),
        ("npu", None, 0, None),
        ("npu", "pkg:Thing", True, "priority must be an int (the highest wins), got True"),
        ("npu", "pkg:Thing", "high", "priority must be an int"),
        (None, "pkg:Thing", 0, "the platform name must be a non-empty str, got None"),
    ],
    ids=["path", "object", "bool_priority", "str_priority", "platform"],
)
def test_a_malformed_registration_raises_the_registry_error_with_its_fix(
    kind, platform, target, priority, expected
):
    with pytest.raises(kind.error) as caught:
        kind.register(kind.new(), platform, target, priority=priority)
    message = str(caught.value)
    assert isinstance(caught.value, RegistryError)
    if expected:
        assert expected in message
    assert "call registry.register(platform_name, " in message or "'module:attr' string" in message


@each_registry
def test_register_own_without_one_own_platform_raises_the_registry_error(kind):
    with pytest.raises(kind.error, match=r"registry.register\(<platform name>, ...\)"):
        kind.register_own(kind.new(("a", "b")), kind.targets[0])


def test_every_registry_error_is_a_slotwise_value_error():
    from slotwise.attention.registry import UnknownAttentionBackendError
    from slotwise.errors import SlotwiseError

    for error in (AttentionBackendError, UnknownAttentionBackendError, CustomOpError):
        assert issubclass(error, RegistryError)
    assert issubclass(RegistryError, SlotwiseError) and issubclass(RegistryError, ValueError)
    assert own_platform(("npu",), "register_own", CustomOpError) == "npu"
