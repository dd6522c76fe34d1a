"""Where Inductor keeps its compiled kernels: beside slotwise's cache unless the user chose."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from slotwise.compilation.inductor_cache_dir import INDUCTOR_CACHE_ENV, place_inductor_cache


@pytest.fixture
def unset(monkeypatch):
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)


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
def test_a_folder_others_can_write_is_refused_with_a_warning(tmp_path, unset, caplog):
    planted = tmp_path / "root" / "inductor"
    planted.mkdir(parents=True)
    planted.chmod(0o777)  # the machine's folder inside it could be swapped
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        assert place_inductor_cache(str(tmp_path / "root")) is None
    assert INDUCTOR_CACHE_ENV not in os.environ
    assert "writable by group or others" in caplog.text
    assert "will not outlive a reboot" in caplog.text


def test_a_default_folder_fixed_by_an_earlier_dynamo_import_is_named(tmp_path, monkeypatch, caplog):
    import tempfile

    import torch._dynamo  # noqa: F401 - as a script that imported it first

    default = os.path.join(tempfile.gettempdir(), "torchinductor_someone")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, default)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        assert place_inductor_cache(str(tmp_path / "root")) == default
    assert "will not outlive a reboot" in caplog.text
