"""Where Inductor keeps its compiled kernels: beside slotwise's cache unless the user chose,
and never in a folder slotwise does not trust."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from slotwise.compilation.cache.inductor_cache_dir import (
    INDUCTOR_CACHE_ENV,
    TRITON_CACHE_ENV,
    place_inductor_cache,
)

OTHER_UID = 1000
needs_root = pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="giving a folder away needs root"
)


@pytest.fixture
def unset(monkeypatch):
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)


def assert_private_folder_of_this_process(folder: str) -> None:
    status = os.stat(folder)
    assert os.path.basename(folder).startswith("slotwise-inductor-")
    assert status.st_uid == os.getuid() and stat.S_IMODE(status.st_mode) == 0o700
    assert os.environ[INDUCTOR_CACHE_ENV] == folder


def test_unset_places_inductor_in_a_private_folder_of_the_cache_root(tmp_path, unset, caplog):
    with caplog.at_level(logging.INFO, logger="slotwise"):
        folder = place_inductor_cache(str(tmp_path / "root"))
    assert os.path.dirname(folder) == str(tmp_path / "root" / "inductor")
    assert os.environ[INDUCTOR_CACHE_ENV] == folder
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert INDUCTOR_CACHE_ENV in caplog.text  # says how to choose another folder


def test_a_cpu_picking_another_vector_isa_gets_another_folder(tmp_path, unset, monkeypatch):
    # Inductor's own cache does not key its C++ code on the ISA; a shared cache root must.
    first = place_inductor_cache(str(tmp_path / "root"))
    monkeypatch.delenv(INDUCTOR_CACHE_ENV)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert place_inductor_cache(str(tmp_path / "root")) != first


def test_a_folder_the_user_chose_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "mine"))
    assert place_inductor_cache(str(tmp_path / "root")) == str(tmp_path / "mine")
    assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "mine")
    assert not (tmp_path / "root").exists()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX modes")
def test_a_folder_others_can_write_sends_inductor_to_a_private_folder(tmp_path, unset, caplog):
    planted = tmp_path / "root" / "inductor"
    planted.mkdir(parents=True)
    planted.chmod(0o777)  # the machine's folder inside it could be swapped
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        folder = place_inductor_cache(str(tmp_path / "root"))
    assert_private_folder_of_this_process(folder)
    assert not list(planted.iterdir())
    assert "writable by group or others" in caplog.text
    assert "nothing compiled now is kept for the next process" in caplog.text  # what is lost
    assert len(caplog.records) == 1  # one warning


@needs_root
def test_a_root_owned_by_another_user_gets_nothing_written_into_it(tmp_path, unset, caplog):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chown(root, OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        folder = place_inductor_cache(str(root))
    assert_private_folder_of_this_process(folder)
    assert not list(root.iterdir())
    assert f"owned by uid {OTHER_UID}" in caplog.text


@needs_root
def test_a_chosen_folder_slotwise_does_not_trust_is_replaced(tmp_path, unset, monkeypatch, caplog):
    chosen = tmp_path / "torchinductor_root"  # as another user may create it first
    chosen.mkdir(mode=0o777)
    os.chown(chosen, OTHER_UID, OTHER_UID)
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(chosen))
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        folder = place_inductor_cache(str(tmp_path / "root"))
    assert_private_folder_of_this_process(folder)
    assert f"{INDUCTOR_CACHE_ENV}={chosen} is not used" in caplog.text


def test_with_the_compile_cache_off_inductor_gets_a_private_folder(unset, caplog):
    with caplog.at_level(logging.INFO, logger="slotwise"):
        folder = place_inductor_cache(None)
    assert_private_folder_of_this_process(folder)
    assert "the compile cache is off" in caplog.text
    assert place_inductor_cache(None) == folder  # one per process


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX modes")
def test_a_triton_folder_others_can_write_is_replaced(tmp_path, unset, monkeypatch, caplog):
    shared = tmp_path / "triton"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(TRITON_CACHE_ENV, str(shared))
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        folder = place_inductor_cache(str(tmp_path / "root"))
    assert os.environ[TRITON_CACHE_ENV] == os.path.join(folder, "triton")
    assert f"{TRITON_CACHE_ENV}={shared} is not used" in caplog.text


def test_a_default_folder_fixed_by_an_earlier_dynamo_import_is_named(tmp_path, monkeypatch, caplog):
    import tempfile

    import torch._dynamo  # noqa: F401 - as a script that imported it first

    default = os.path.join(tempfile.gettempdir(), "torchinductor_someone")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, default)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        assert place_inductor_cache(str(tmp_path / "root")) == default
    assert "will not outlive a reboot" in caplog.text
