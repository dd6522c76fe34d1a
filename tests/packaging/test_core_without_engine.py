"""``pip install slotwise slotwise-cpu`` alone: a vendor's installation, without the engine.

A fresh venv gets torch (the pinned CPU build, from the local wheel cache), then the
wheels of the core and the CPU plugin, and none of the engine's model-specific
dependencies: torch pulls jinja2 in, and it is removed, so that nothing of the core can
lean on it unseen.  There the conformance suite runs and passes, and the engine's
command says which distribution to install.  Adding the engine's wheel to the
same venv then adds ``generate`` and ``bench`` and the ``slotwise_engine.models`` package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env

ROOT = Path(__file__).resolve().parents[2]
MODEL_DEPENDENCIES = ("safetensors", "tokenizers", "jinja2")
INSTALL = "pip install slotwise-engine"

pytestmark = pytest.mark.slow


class Venv:
    def __init__(self, folder: Path, wheels: Path) -> None:
        self.folder = folder
        self.wheels = wheels
        self.bin = folder / "bin"

    def run(self, *command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``command`` with this venv's programs first on PATH and nothing else of ours."""
        env = clean_env()
        for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
            env.pop(name, None)
        env["PATH"] = os.pathsep.join((str(self.bin), env.get("PATH", "")))
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)

    def pip(self, command: str, *args: str) -> None:
        # No bytecode compiled at install: most of the time torch's install would take.
        options = ["--no-compile"] if command == "install" else []
        done = self.run(str(self.bin / "python"), "-m", "pip", command, "--quiet", *options, *args)
        assert done.returncode == 0, done.stderr[-4000:]

    def wheel(self, name: str) -> str:
        (path,) = self.wheels.glob(f"{name}-*.whl")
        return str(path)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "python"), "-c", code)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The core and the CPU plugin from their wheels, without the model dependencies."""
    folder = tmp_path_factory.mktemp("core-alone")
    wheels = folder / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    sources = [str(ROOT), str(ROOT / "plugins" / "cpu"), str(ROOT / "engine")]
    subprocess.run([*build, "--wheel-dir", str(wheels), *sources], check=True, timeout=600)
    subprocess.run([sys.executable, "-m", "venv", str(folder / "venv")], check=True, timeout=300)
    env = Venv(folder / "venv", wheels)
    # torch pinned by the constraints, as `make setup` installs it (a CPU build, on disk).
    constraints = str(ROOT / "constraints-cpu.txt")
    env.pip("install", "-c", constraints, "torch", env.wheel("slotwise"), env.wheel("slotwise_cpu"))
    env.pip("uninstall", "--yes", "jinja2")  # torch's dependency, not one of slotwise's
    return env


def test_the_model_dependencies_are_not_installed(venv):
    for module in MODEL_DEPENDENCIES:
        done = venv.python(f"import {module}")
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, module


def test_conformance_passes_with_the_core_and_the_cpu_plugin_alone(venv):
    done = venv.run("slotwise", "conformance", "cpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("PASSED")


def test_the_engine_commands_say_what_to_install(venv):
    done = venv.run("slotwise", "generate", "--model", "folder", "--prompt", "hello")
    assert done.returncode == 2
    # One line; what may precede it is torch's own warning that numpy is not installed.
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("slotwise")]
    assert line.startswith("slotwise: error: slotwise generate is part of the slotwise-engine")
    assert INSTALL in line and "Traceback" not in done.stderr
    for command in (["bench", "--preset", "tiny"], ["serve", "--model", "folder"]):
        done = venv.run("slotwise", *command)
        assert done.returncode == 2 and INSTALL in done.stderr, command
    imported = venv.python("import slotwise_engine.models")
    assert imported.returncode != 0
    assert "No module named 'slotwise_engine'" in imported.stderr


def test_the_engine_wheel_joins_the_core_in_one_venv(venv):
    venv.pip("install", venv.wheel("slotwise_engine"))
    try:
        done = venv.run("slotwise", "generate", "--help")
        assert done.returncode == 0, done.stderr
        assert "--model" in done.stdout
        imported = venv.python(
            "import slotwise, slotwise_engine.models, slotwise_engine.runner.model_runner\n"
            "print(slotwise.__file__, slotwise_engine.models.supported_architectures())"
        )
        assert imported.returncode == 0, imported.stderr
        assert "LlamaForCausalLM" in imported.stdout
    finally:
        # The venv is the module's: the tests above expect it without the engine.
        venv.pip("uninstall", "--yes", "slotwise-engine", *MODEL_DEPENDENCIES)
