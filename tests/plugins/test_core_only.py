"""The core installed without any platform plugin: a clear error naming the fix."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import packaging
import pluggy
from support import clean_env

import slotwise


def make_core_only_venv(root: Path) -> Path:
    """A fresh venv holding slotwise and its pure-Python dependencies, and no plugin."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    site = Path(purelib)
    for module in (slotwise, pluggy, packaging):
        (site / module.__name__).symlink_to(Path(module.__file__).parent)
    info = site / f"slotwise-{slotwise.__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: slotwise\nVersion: {slotwise.__version__}\n"
    )
    assert sysconfig.get_paths()["purelib"] != purelib
    return python


def test_core_without_plugins_raises_platform_not_found_naming_slotwise_cpu(tmp_path):
    python = make_core_only_venv(tmp_path / "venv")
    result = subprocess.run(
        [
            str(python),
            "-c",
            "import slotwise\n"
            "from slotwise.platforms import get_current_platform, UnspecifiedPlatform\n"
            "assert isinstance(get_current_platform(), UnspecifiedPlatform)\n"
            "slotwise.current_platform.device_count()\n",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert result.returncode != 0
    assert "PlatformNotFoundError" in result.stderr
    assert "no platform plugin is installed" in result.stderr
    assert "pip install slotwise-cpu" in result.stderr
