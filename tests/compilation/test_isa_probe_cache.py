"""Inductor's ISA-probe answers are cached only under a cache root slotwise trusts."""

from __future__ import annotations

import json
import logging
import os

import pytest

from slotwise.compilation.cache import isa_probe_cache

OTHER_UID = 1000


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """A fake ISA probe installed as Inductor's; returns the calls it received."""
    from torch._inductor import cpu_vec_isa

    calls = []

    def fake_probe(self, output_path):
        calls.append(output_path)
        return True

    monkeypatch.setattr(cpu_vec_isa.VecISA, "_probe_load", fake_probe)
    monkeypatch.setattr(isa_probe_cache, "_installed_root", None)
    library = tmp_path / "probe.so"
    library.write_bytes(b"a probe library")
    return calls, str(library)


def ask(library: str) -> bool:
    from torch._inductor import cpu_vec_isa

    return cpu_vec_isa.VecISA._probe_load(object(), library)


def test_an_answer_is_stored_once_and_reused(tmp_path, probe):
    calls, library = probe
    isa_probe_cache.install_isa_probe_cache(str(tmp_path / "root"))
    assert ask(library) is True and ask(library) is True
    assert len(calls) == 1
    (entry,) = (tmp_path / "root" / "isa_probe").iterdir()
    assert json.loads(entry.read_text()) == {"ok": True}


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="giving a folder away needs root"
)
def test_a_root_owned_by_another_user_gets_no_isa_probe_folder(tmp_path, probe, caplog):
    calls, library = probe
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chown(root, OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        isa_probe_cache.install_isa_probe_cache(str(root))
    assert ask(library) is True and ask(library) is True
    assert len(calls) == 2  # asked every time, as without slotwise
    assert not list(root.iterdir())
    assert f"ISA probe answers are not cached: {root} is owned by uid {OTHER_UID}" in caplog.text


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX modes")
def test_a_root_made_writable_after_install_is_not_written(tmp_path, probe):
    calls, library = probe
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    isa_probe_cache.install_isa_probe_cache(str(root))
    root.chmod(0o777)  # someone else could now swap isa_probe/ in
    assert ask(library) is True and len(calls) == 1
    assert not list(root.iterdir())
