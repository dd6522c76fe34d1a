"""The "foreign" test device: built once per session, with a slotwise plugin for it.

A device type that is neither cpu nor cuda, so code that assumes one of them fails here
rather than at a vendor.  ``foreign_library`` compiles ``csrc/foreign_device.cpp`` (a
PrivateUse1 backend on host memory, torch's CPU fallback for every other op) with
torch's JIT extension builder; ``foreign_site`` is a folder of distributions to put on
PYTHONPATH: ``foreign_torch`` (the device's torch package, as torch_npu is a vendor's)
and ``slotwise-foreign``, the plugin ``slotwise new-plugin foreign --graphs`` writes, with
its platform (``plugin/platform.py``) and communicator (``plugin/communicator.py``)
asking the device instead of the host CPU.  Everything runs in subprocesses: loading
the device into this process would change torch for every later test.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import clean_env, pip_install_into

HERE = Path(__file__).parent
SOURCE = HERE / "csrc" / "foreign_device.cpp"
LIBRARY = "foreign_device.so"
#: A cold build takes about a minute on two busy cores; this only guards against a hang.
BUILD_TIMEOUT_S = 900

BUILD = """
import sys
from torch.utils.cpp_extension import load

source, build_directory = sys.argv[1:]
load(
    name="foreign_device",
    sources=[source],
    build_directory=build_directory,
    extra_cflags=["-O1", "-g0"],
    is_python_module=False,
)
"""


@pytest.fixture(scope="session")
def foreign_library(request: pytest.FixtureRequest, tmp_path_factory) -> Path:
    """``foreign_device.so``, built once per source, torch and Python in pytest's cache
    folder (in a temporary one without the cache plugin)."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        pytest.skip(f"the foreign test device needs a C++ compiler ({compiler} is not on PATH)")
    if shutil.which("ninja") is None:
        pytest.skip("the foreign test device needs ninja, torch's extension builder")
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    root = (
        tmp_path_factory.mktemp("foreign_device_build")
        if cache is None
        else cache.mkdir("foreign_device_build")
    )
    built = root / build_key()
    if not (built / LIBRARY).exists():
        build_into(root, built)
    return built / LIBRARY


def build_key() -> str:
    """What the library depends on: its source, how it is built, torch and Python."""
    described = "\n".join(
        [SOURCE.read_text(), BUILD, importlib.metadata.version("torch"), sys.version]
    )
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def build_into(root: Path, built: Path) -> None:
    """Build in a folder of this session's own, then rename it to ``built``: sessions
    building at once never share a folder, and one killed half-way leaves no lock
    behind.  The first rename wins; a later session's build is dropped."""
    staging = Path(tempfile.mkdtemp(prefix="building-", dir=root))
    result = subprocess.run(
        [sys.executable, "-c", BUILD, str(SOURCE), str(staging)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if result.returncode != 0:
        shutil.rmtree(staging)
        pytest.fail(f"building {SOURCE.name} failed:\n{result.stderr[-8000:]}")
    try:
        staging.rename(built)
    except OSError:  # another session renamed its build there first
        shutil.rmtree(staging)


@pytest.fixture(scope="session")
def foreign_site(foreign_library: Path, tmp_path_factory) -> Path:
    """A folder with the device's torch package and its slotwise plugin, installed."""
    site = tmp_path_factory.mktemp("foreign_site")
    package = site / "foreign_torch"
    shutil.copytree(HERE / "torch_package", package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(foreign_library, package / LIBRARY)

    plugin = tmp_path_factory.mktemp("foreign_plugin") / "slotwise-foreign"
    subprocess.run(
        [sys.executable, "-m", "slotwise", "new-plugin", "foreign", "--graphs", "--path",
         str(plugin)],
        env=clean_env(),
        check=True,
        capture_output=True,
    )  # fmt: skip
    for name in ("platform.py", "communicator.py"):
        shutil.copy(HERE / "plugin" / name, plugin / "slotwise_foreign" / name)
    pip_install_into(site, plugin)
    return site
