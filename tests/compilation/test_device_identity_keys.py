"""The compile cache, Inductor's cache folder and warm starts are keyed on the device's
identity as its platform tells it (``Platform.device_identity``): code compiled for one
device is never loaded for another, and the core asks no vendor's device itself."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from slotwise.compilation.cache import inductor_cache_dir
from slotwise.compilation.cache.compile_cache import FACTORS_FILE, CompileCache
from slotwise.compilation.compilers import EagerCompiler
from slotwise.compilation.config import CompilationConfig
from slotwise.compilation.warm_start.facts import unguarded_facts
from slotwise.platforms import Platform, PlatformError, use_platform


class VendorPlatform(Platform):
    """A platform whose device says what generation it is."""

    name = "vendor"
    device_type = "cpu"

    def __init__(self, generation: str) -> None:
        super().__init__()
        self.generation = generation

    def device_identity(self, **kwargs: Any) -> dict[str, str]:
        return {**super().device_identity(), "name": "Vendor X", "generation": self.generation}


def cache_directory(platform: Platform, root: str) -> str:
    config = CompilationConfig(level=3, backend="eager", cache_dir=root)
    with use_platform(platform):
        return CompileCache(config, EagerCompiler(config), factors={"model": "m"}).directory


def test_two_device_identities_get_two_compile_cache_folders(tmp_path):
    first = cache_directory(VendorPlatform("1"), str(tmp_path))
    assert cache_directory(VendorPlatform("1"), str(tmp_path)) == first
    assert cache_directory(VendorPlatform("2"), str(tmp_path)) != first


class SavingEagerCompiler(EagerCompiler):
    """The eager compiler, with the disk cache on (as a compiler that saves has it)."""

    supports_persistence = True


def test_the_cache_folder_records_the_identity_it_is_keyed_on(tmp_path):
    config = CompilationConfig(level=3, backend="eager", cache_dir=str(tmp_path))
    with use_platform(VendorPlatform("2")):
        cache = CompileCache(config, SavingEagerCompiler(config), factors={"model": "m"})
        cache.write_named("probe", b"x")
    factors = json.loads((tmp_path / cache.directory / FACTORS_FILE).read_text())
    assert factors["device"]["identity"] == {
        "platform": "vendor",
        "device_type": "cpu",
        "torch": torch.__version__,
        "name": "Vendor X",
        "generation": "2",
    }


def test_inductors_folder_and_warm_starts_follow_the_identity():
    keys, facts = [], []
    for generation in ("1", "2"):
        with use_platform(VendorPlatform(generation)):
            keys.append(inductor_cache_dir._machine_key())
            facts.append(unguarded_facts()["device"])
    assert keys[0] != keys[1]
    assert [fact["generation"] for fact in facts] == ["1", "2"]


def test_the_base_identity_names_the_platform_its_device_type_and_torch():
    class Plain(Platform):
        name = "plain"
        device_type = "npu"

    assert Plain().device_identity() == {
        "platform": "plain",
        "device_type": "npu",
        "torch": torch.__version__,
    }


@pytest.mark.parametrize("identity", [["Vendor X"], {"generation": 2}, {3: "x"}])
def test_an_identity_that_is_not_a_dict_of_strings_is_the_plugins_error(tmp_path, identity):
    class Broken(VendorPlatform):
        def device_identity(self, **kwargs: Any) -> Any:
            return identity

    with pytest.raises(PlatformError) as refused:
        cache_directory(Broken("1"), str(tmp_path))
    assert str(refused.value).startswith(
        f"platform 'vendor' (Broken).device_identity() returned {type(identity).__name__} "
    )
    assert "it must return a dict of strings" in str(refused.value)
