"""Where Inductor keeps its compiled kernels: beside slotwise's cache unless the user chose,
never in a folder slotwise does not trust, always by its real path, and never on a disk
with too little room for a compile."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import subprocess
import sys
import tempfile

import pytest
from support import LEVEL3_INDUCTOR_AGAINST_EAGER, clean_env

from slotwise.compilation.cache import inductor_cache_dir
from slotwise.compilation.cache.inductor_cache_dir import (
    INDUCTOR_CACHE_ENV,
    TRITON_CACHE_ENV,
    CacheDiskFullError,
    compile_ran_out_of_space,
    move_off_full_disk,
    place_inductor_cache,
    place_precompiled_headers,
)

OTHER_UID = 1000
needs_root = pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="giving a folder away needs root"
)


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """Each test places Inductor as a new process would: nothing placed before."""
    monkeypatch.setattr(inductor_cache_dir, "_placed", None)


@pytest.fixture
def unset(monkeypatch):
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)


@pytest.fixture
def temporary(tmp_path, monkeypatch):
    """The system's temporary folder, for this test: ``tmp_path/tmp``."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@contextlib.contextmanager
def mounted_tmpfs(folder, options: str):
    """A tmpfs at ``folder`` with mount ``options``; skips where mounting is not allowed."""
    folder.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


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
    assert f"{INDUCTOR_CACHE_ENV}={chosen} is not trusted" in caplog.text


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
    assert f"{TRITON_CACHE_ENV}={shared} is not trusted" in caplog.text


def test_a_default_folder_fixed_by_an_earlier_dynamo_import_is_named(
    temporary, monkeypatch, caplog
):
    import torch._dynamo  # noqa: F401 - as a script that imported it first
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = default_cache_dir()
    assert os.path.dirname(default) == str(temporary)
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, default)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        assert place_inductor_cache(str(temporary / "root")) == default
    assert "Dynamo was imported before slotwise compiled" in caplog.text
    assert "will not outlive a reboot" in caplog.text


def test_a_root_under_the_temporary_folder_is_not_blamed_on_dynamo(temporary, unset, caplog):
    import torch._dynamo  # noqa: F401 - the compile imports it between two placements

    with caplog.at_level(logging.INFO, logger="slotwise"):
        first = place_inductor_cache(str(temporary / "root"))
        assert place_inductor_cache(str(temporary / "root")) == first  # as the compile does
    assert first.startswith(str(temporary / "root"))
    assert "Dynamo" not in caplog.text
    assert len(caplog.records) == 1  # where it is, once


# --- links: only the real path a check resolved is handed on ------------------------------


def test_a_chosen_folder_reached_through_your_own_link_is_handed_on_by_its_real_path(
    tmp_path, unset, monkeypatch
):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "link"))
    monkeypatch.setenv(TRITON_CACHE_ENV, str(tmp_path / "link" / "triton"))
    assert place_inductor_cache(str(tmp_path / "root")) == str(real)
    assert os.environ[INDUCTOR_CACHE_ENV] == str(real)
    assert os.environ[TRITON_CACHE_ENV] == str(real / "triton")


def sticky_shared_folder(tmp_path):
    """A folder like /tmp: everyone may create entries, only an entry's owner may replace it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def link_of_another_user(link, target):
    link.symlink_to(target)
    os.chown(link, OTHER_UID, OTHER_UID, follow_symlinks=False)


@needs_root
@pytest.mark.parametrize("variable", ["cache root", INDUCTOR_CACHE_ENV])
def test_a_link_another_user_owns_is_refused_though_it_points_at_your_folder(
    tmp_path, unset, monkeypatch, caplog, variable
):
    yours = tmp_path / "yours"
    yours.mkdir(mode=0o700)
    link = sticky_shared_folder(tmp_path) / "cache"
    link_of_another_user(link, yours)  # its owner may re-point it once slotwise checked it
    root = str(link) if variable == "cache root" else str(tmp_path / "root")
    if variable == INDUCTOR_CACHE_ENV:
        monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(link))
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        folder = place_inductor_cache(root)
    assert_private_folder_of_this_process(folder)
    assert f"{link} is a symbolic link owned by uid {OTHER_UID}" in caplog.text
    assert not list(yours.iterdir())


@needs_root
def test_a_triton_link_another_user_owns_is_replaced(tmp_path, unset, monkeypatch, caplog):
    yours = tmp_path / "yours"
    yours.mkdir(mode=0o700)
    link = sticky_shared_folder(tmp_path) / "triton"
    link_of_another_user(link, yours)
    monkeypatch.setenv(TRITON_CACHE_ENV, str(link))
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        folder = place_inductor_cache(str(tmp_path / "root"))
    assert os.environ[TRITON_CACHE_ENV] == os.path.join(folder, "triton")
    assert f"{TRITON_CACHE_ENV}={link} is not trusted" in caplog.text


@needs_root
def test_your_folder_inside_a_sticky_shared_folder_is_used(tmp_path, unset):
    root = sticky_shared_folder(tmp_path) / "root"  # as /tmp/<yours>
    root.mkdir(mode=0o700)
    assert place_inductor_cache(str(root)).startswith(str(root / "inductor"))


# --- full, read-only and unwritable disks ------------------------------------------------


@needs_root
def test_a_read_only_cache_root_is_called_read_only_not_untrusted(tmp_path, unset, caplog):
    with mounted_tmpfs(tmp_path / "root", "ro,mode=700") as root:
        with caplog.at_level(logging.WARNING, logger="slotwise"):
            folder = place_inductor_cache(str(root))
    assert_private_folder_of_this_process(folder)
    assert f"the compile cache root cannot be used: {root}" in caplog.text
    assert "is on a read-only file system" in caplog.text
    assert "not trusted" not in caplog.text
    assert len(caplog.records) == 1


@needs_root
def test_a_cache_root_you_may_not_write_says_permission(tmp_path):
    """In a process that has dropped root's right to write anywhere."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o500)  # yours, private, and read-only to you
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format='%(message)s')\n"
        "from slotwise.compilation.cache.inductor_cache_dir import place_inductor_cache\n"
        f"place_inductor_cache({str(closed / 'root')!r})\n"
    )
    environment = clean_env(TMPDIR=str(tmp_path))
    environment.pop(INDUCTOR_CACHE_ENV, None)
    without_override = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    result = subprocess.run(
        [*without_override, sys.executable, "-c", script], capture_output=True, text=True,
        env=environment, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        f"the compile cache root cannot be used: permission denied writing into {closed}/root"
        in result.stderr
    )
    assert "not trusted" not in result.stderr
    assert result.stderr.count("\n") == 1  # one warning


@needs_root
def test_a_full_cache_root_sends_inductor_to_a_private_folder(tmp_path, unset, caplog):
    with mounted_tmpfs(tmp_path / "root", "size=1m,mode=700") as root:
        with caplog.at_level(logging.WARNING, logger="slotwise"):
            folder = place_inductor_cache(str(root))
        assert_private_folder_of_this_process(folder)
        (warning,) = caplog.records
        assert f"Inductor's cache {root}/inductor/" in warning.getMessage()
        assert (
            "its disk has 1 MiB free, less than the 64 MiB Inductor needs" in warning.getMessage()
        )
        assert "free space there" in warning.getMessage()


@needs_root
def test_a_cache_root_out_of_inodes_sends_inductor_to_a_private_folder(tmp_path, unset, caplog):
    with mounted_tmpfs(tmp_path / "root", "size=100m,nr_inodes=20,mode=700") as root:
        with caplog.at_level(logging.WARNING, logger="slotwise"):
            folder = place_inductor_cache(str(root))
        assert_private_folder_of_this_process(folder)
        assert "inodes (files) free, fewer than the 1024 Inductor needs" in caplog.text


@needs_root
def test_no_room_anywhere_is_one_error_naming_the_folder_and_the_fix(tmp_path, unset, monkeypatch):
    with mounted_tmpfs(tmp_path / "tmp", "size=1m,mode=700") as full:
        monkeypatch.setattr(tempfile, "tempdir", str(full))
        monkeypatch.setattr(inductor_cache_dir, "_private", None)
        with pytest.raises(CacheDiskFullError) as raised:
            place_inductor_cache(None)
        inductor_cache_dir._private = None  # removed with the mount
    message = str(raised.value)
    assert f"its private temporary folder {full}/slotwise-inductor-" in message
    assert "1 MiB free, less than the 64 MiB Inductor needs" in message
    assert "set TMPDIR, TORCHINDUCTOR_CACHE_DIR or SLOTWISE_CACHE_ROOT" in message
    assert "\n" not in message


@needs_root
def test_precompiled_headers_are_switched_off_on_a_disk_without_room_for_them(
    tmp_path, monkeypatch, caplog
):
    from torch._inductor import config as inductor_config

    with (
        headers_precompiled(),
        mounted_tmpfs(tmp_path / "inductor", "size=100m,mode=700") as folder,
    ):
        monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(folder))
        with caplog.at_level(logging.WARNING, logger="slotwise"):
            place_precompiled_headers()
        assert not inductor_config.cpp_cache_precompile_headers
        assert not inductor_config.aot_inductor.precompile_headers
    (warning,) = caplog.records
    assert f"the disk holding {folder} has 100 MiB free, less than 512 MiB" in warning.getMessage()


def headers_precompiled():
    """Inductor precompiling its C++ headers, as it does by default, until the block ends."""
    from torch._inductor import config as inductor_config

    return inductor_config.patch(
        {"cpp_cache_precompile_headers": True, "aot_inductor.precompile_headers": True}
    )


class CppCompileFailed(Exception):
    """What Inductor raises when the C++ compiler fails, its output in the message."""


def test_a_compile_that_ran_out_of_space_is_recognised_whatever_wraps_it():
    compiler_said = CppCompileFailed("fatal error: cannot write PCH file: No space left on device")
    wrapped = RuntimeError("InductorError: CppCompileError")
    wrapped.__cause__ = compiler_said
    assert compile_ran_out_of_space(wrapped)
    quota = RuntimeError("backend failed")
    quota.inner_exception = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert compile_ran_out_of_space(quota)
    assert not compile_ran_out_of_space(RuntimeError("C++ compile error: expected ';'"))
    assert not compile_ran_out_of_space(PermissionError(errno.EACCES, "Permission denied"))


def test_after_running_out_of_space_inductor_moves_to_a_private_folder_once(
    tmp_path, monkeypatch, caplog
):
    from torch._inductor import config as inductor_config

    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "filled"))
    with headers_precompiled(), caplog.at_level(logging.WARNING, logger="slotwise"):
        folder = move_off_full_disk()
        assert not inductor_config.cpp_cache_precompile_headers
    assert_private_folder_of_this_process(folder)
    (warning,) = caplog.records
    assert (
        f"a compile ran out of space in Inductor's cache {tmp_path / 'filled'}"
        in warning.getMessage()
    )
    with pytest.raises(
        CacheDiskFullError, match="its private temporary folder .* ran out of space"
    ):
        move_off_full_disk()  # nowhere left to go


#: A level-3 Inductor compile checked against eager; what it logs goes to stderr.
COMPILE = (
    """
import logging, sys
import torch
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
"""
    + LEVEL3_INDUCTOR_AGAINST_EAGER
)
#: Makes Inductor start in a folder whatever room its disk has, precompiled headers on.
EVERY_DISK_WILL_DO = """
from slotwise.compilation.cache import inductor_cache_dir
inductor_cache_dir.MIN_FREE_MIB = inductor_cache_dir.MIN_FREE_INODES = 0
inductor_cache_dir.HEADERS_FREE_MIB = 0
"""


def compile_with_cache_root(root, temporary, prelude: str = "") -> subprocess.CompletedProcess:
    environment = clean_env(SLOTWISE_CACHE_ROOT=str(root), TMPDIR=str(temporary))
    environment.pop(INDUCTOR_CACHE_ENV, None)
    environment.pop(TRITON_CACHE_ENV, None)
    return subprocess.run(
        [sys.executable, "-c", prelude + COMPILE], capture_output=True, text=True,
        env=environment, timeout=600,
    )  # fmt: skip


@pytest.mark.slow  # two processes compile with Inductor
@needs_root
def test_a_level_3_compile_on_a_full_cache_disk_runs_with_one_warning(tmp_path, temporary):
    with mounted_tmpfs(tmp_path / "root", "size=1m,mode=700") as root:
        # Seen before Inductor starts: the folder is not used at all.
        early = compile_with_cache_root(root, temporary)
        # Not seen in time (the disk filled meanwhile): the compile that ran out of space
        # is tried again in the private folder, without precompiled headers.
        late = compile_with_cache_root(root, temporary, EVERY_DISK_WILL_DO)
    for result in (early, late):
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        assert "cached in a private temporary folder of this process only" in result.stderr
        assert "free space there or set TORCHINDUCTOR_CACHE_DIR or SLOTWISE_CACHE_ROOT" in (
            result.stderr
        )
        assert not list(temporary.glob("slotwise-inductor-*"))  # the private folder is gone
    assert f"Inductor's cache {root}/inductor/" in early.stderr
    assert "its disk has 1 MiB free, less than the 64 MiB Inductor needs" in early.stderr
    assert f"a compile ran out of space in Inductor's cache {root}/inductor/" in late.stderr
    assert late.stderr.count("a compile ran out of space") == 1
