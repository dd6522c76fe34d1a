"""Test helpers: throwaway plugin distributions and clean subprocess environments."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without any SLOTWISE_* variable, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    env.update(overrides)
    return env


@dataclass
class Distributions:
    """A folder on sys.path holding real ``*.dist-info`` distributions.

    importlib.metadata finds their entry points exactly as it finds installed
    packages, so plugin discovery is exercised end to end.
    """

    root: Path

    def add(
        self,
        dist_name: str,
        module_source: str,
        *,
        entry_point: str | None = None,
        version: str = "1.0",
    ) -> str:
        module = dist_name.replace("-", "_")
        (self.root / f"{module}.py").write_text(textwrap.dedent(module_source))
        info = self.root / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
        )
        (info / "entry_points.txt").write_text(
            f"[slotwise.plugins]\n{entry_point or module} = {module}\n"
        )
        return module

    def run(self, code: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a fresh interpreter that sees these distributions."""
        return self._python(["-c", textwrap.dedent(code)], env)

    def run_module(self, module: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``python -m module args`` in a fresh interpreter that sees these distributions
        (``-m`` ends a process differently from ``-c`` after a Ctrl-C)."""
        return self._python(["-m", module, *args], {})

    def _python(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        environ = clean_env(**env)
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.root), environ.get("PYTHONPATH", "")) if p
        )
        return subprocess.run(
            [sys.executable, *args], env=environ, capture_output=True, text=True, timeout=120
        )


#: What torchrun tells its workers; cleared so a test's processes see only its own.
LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of asking."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_env(**overrides: str) -> dict[str, str]:
    """``clean_env`` without a launcher's variables, one CPU thread per process."""
    env = {k: v for k, v in clean_env().items() if k not in LAUNCHER_VARIABLES}
    env["OMP_NUM_THREADS"] = "1"  # N processes on few cores: no oversubscription
    env.update(overrides)
    return env


def torchrun(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (a script and its arguments, or ``-m module ...``) under torchrun as
    two processes on 127.0.0.1, in ``process_env(**env)``; output captured as text."""
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()),
        *args,
    ]  # fmt: skip
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=process_env(**env)
    )


def torchrun_env(rank: int, world_size: int, port: int, **overrides: str) -> dict[str, str]:
    """The environment torchrun gives rank ``rank`` of a one-machine job on 127.0.0.1."""
    return process_env(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **overrides,
    )


@dataclass
class Finished:
    """One process of ``run_together``: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str


def run_together(
    commands: Sequence[tuple[Sequence[str], Mapping[str, str]]], timeout: float
) -> list[Finished]:
    """Start every ``(argv, env)`` at once and wait for all, killing them all at ``timeout``.

    Output goes to files, not pipes, so a chatty process cannot block on a full pipe
    while its peers wait for it in a collective.  A timeout fails the test with every
    process's output.
    """
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory() as folder:
        logs = [
            (Path(folder, f"{i}.out").open("w+"), Path(folder, f"{i}.err").open("w+"))
            for i in range(len(commands))
        ]
        processes = [
            subprocess.Popen(list(argv), env=dict(env), stdout=out, stderr=err, text=True)
            for (argv, env), (out, err) in zip(commands, logs, strict=True)
        ]
        timed_out = False
        for process in processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        finished = []
        for process, (out, err) in zip(processes, logs, strict=True):
            if timed_out:
                process.kill()  # a no-op for those that already exited
            process.wait()
            out.seek(0)
            err.seek(0)
            finished.append(Finished(process.returncode, out.read(), err.read()))
            out.close()
            err.close()
    if timed_out:
        report = "\n".join(
            f"--- process {i} (exit {f.returncode})\n{f.stdout}\n{f.stderr[-4000:]}"
            for i, f in enumerate(finished)
        )
        raise AssertionError(f"processes still running after {timeout} s were killed\n{report}")
    return finished


def pip_install_into(site: Path, folder: Path) -> None:
    """Install the distribution in ``folder`` into the folder ``site`` (no dependencies,
    no build isolation: what the test's interpreter has builds it)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(folder)],
        check=True,
        capture_output=True,
    )  # fmt: skip


#: Python source of a level-3 Inductor compile of the toy model, checked against eager:
#: what the tests of Inductor's cache folder run in a process of their own.
LEVEL3_INDUCTOR_AGAINST_EAGER = """
from slotwise.compilation import CompilationConfig
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel

config = CompilationConfig(level=3, backend="inductor", splitting_ops=TOY_SPLITTING_OPS)
torch.manual_seed(0)
model = SillyModel(compilation_config=config)
torch.manual_seed(0)
reference = SillyModel(compilation_config=CompilationConfig(level=0))
x = torch.randn(5, 8)
torch.testing.assert_close(model(x), reference(x))
"""


def skip_cuda_tests_without_a_gpu(items: list) -> None:
    """Skip the tests marked ``cuda`` among ``items`` where no NVIDIA GPU is usable (a
    conftest's ``pytest_collection_modifyitems``)."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked:
        return
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in marked:
        item.add_marker(skip)


def keep_inductors_default_cache_folder() -> None:
    """One Inductor cache folder for the whole run, Inductor's own default: otherwise the
    first test compiling with Inductor would move it into its temporary slotwise cache for
    every later test (a conftest's ``pytest_configure``). The tests of that placement
    unset the variable in their processes."""
    import getpass

    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default)


@contextlib.contextmanager
def command_logging_left_as_found() -> Iterator[None]:
    """Undo what ``main()`` run in this process did to the commands' loggers (a handler,
    a level, no propagation): otherwise every later test in the process logs through them
    and finds lines it did not ask for on its stderr (an autouse fixture of the
    conftests)."""
    from slotwise.cli.main import COMMAND_LOGGERS

    loggers = [logging.getLogger(name) for name in COMMAND_LOGGERS]
    saved = [(logger, list(logger.handlers), logger.level, logger.propagate) for logger in loggers]
    try:
        yield
    finally:
        for logger, handlers, level, propagate in saved:
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
