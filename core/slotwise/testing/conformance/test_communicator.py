"""Check ``communicator``: the platform's collectives give the right results across two processes.

torchrun starts two ranks on 127.0.0.1; each joins with ``init_distributed`` (the
platform's ``dist_backend`` and ``get_communicator_cls()``) and runs all_reduce,
all_gather, reduce_scatter, broadcast, send/recv and a barrier on the world
communicator (see ``collectives_worker``).  SLOTWISE_DIST_TIMEOUT bounds every
collective and the whole job has a deadline, so a broken backend fails, never hangs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from slotwise.testing.conformance import target

WORLD_SIZE = 2
#: Seconds one collective may take before the ranks give up.
COLLECTIVE_TIMEOUT_S = 60
#: Seconds the whole job may take.
JOB_TIMEOUT_S = 240


def test_collectives_across_two_processes() -> None:
    platform = target.platform()
    try:
        from slotwise.distributed import Communicator
    except ImportError:
        target.not_run("slotwise.distributed cannot be imported here")
    try:
        communicator_cls = platform.get_communicator_cls() or Communicator
    except NotImplementedError as exc:
        target.skip(f"no communicator, so no distributed check: {exc}")
    if not (isinstance(communicator_cls, type) and issubclass(communicator_cls, Communicator)):
        target.fail(
            f"get_communicator_cls() returned {communicator_cls!r}, expected a subclass of "
            "slotwise.distributed.Communicator"
        )
    if platform.device_control_env_var and platform.device_count() < WORLD_SIZE:
        target.not_run(
            f"needs {WORLD_SIZE} devices: each rank claims a device of its own, and only "
            f"{platform.device_count()} is visible; make {WORLD_SIZE} visible "
            f"({platform.device_control_env_var})"
        )
    with tempfile.TemporaryDirectory(prefix="slotwise-conformance-") as out_dir:
        output = run_ranks(Path(out_dir))
        results = {
            rank: json.loads(path.read_text())
            for rank in range(WORLD_SIZE)
            if (path := Path(out_dir) / f"rank{rank}.json").exists()
        }
    problems = [
        f"rank {rank}: {step}: {outcome}"
        for rank, steps in sorted(results.items())
        for step, outcome in steps.items()
        if outcome != "ok"
    ]
    missing = [str(rank) for rank in range(WORLD_SIZE) if rank not in results]
    if missing:
        problems.append(f"rank {', '.join(missing)} reported nothing; torchrun said:\n{output}")
    if problems:
        target.fail(
            f"collectives of {communicator_cls.__name__} across {WORLD_SIZE} processes "
            f"(backend {platform.dist_backend!r}): " + "; ".join(problems)
        )


def run_ranks(out_dir: Path) -> str:
    """Start the ranks with torchrun, wait for them, and return the tail of their output."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={WORLD_SIZE}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "slotwise.testing.conformance.collectives_worker",
        str(out_dir),
    ]
    env = {**os.environ, "SLOTWISE_DIST_TIMEOUT": str(COLLECTIVE_TIMEOUT_S), "OMP_NUM_THREADS": "1"}
    # A session of its own, so a deadline can end torchrun together with its ranks.
    job = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = job.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        output += f"\n(killed after {JOB_TIMEOUT_S} s)"
    return output[-3000:]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
