"""The host-staged communicator of docs/plugin-authors.md runs as written: on two gloo
ranks every collective it overrides answers what the base ``Communicator`` answers,
``broadcast`` writes in place, and ``recv`` keeps the base class's defaults and checks.

On the CPU the copies to the host change nothing, so this holds the example to the
communicator contract; a device that gloo cannot take is tests/foreign_device's.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from support import free_port, run_together, torchrun_env

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import datetime
import json

import torch
import torch.distributed as dist

from slotwise.plugin_api import Communicator
from staged import HostStagedCommunicator

dist.init_process_group("gloo")
rank = dist.get_rank()
make = dict(name="world", device=torch.device("cpu"), timeout=datetime.timedelta(seconds=60))
staged = HostStagedCommunicator(dist.group.WORLD, **make)
base = Communicator(dist.group.WORLD, **make)
x = torch.arange(12.0).reshape(3, 4) + 100 * rank
results = {}
for name, call in {
    "all_reduce": lambda c: c.all_reduce(x),
    "all_gather_0": lambda c: c.all_gather(x, 0),
    "all_gather_last": lambda c: c.all_gather(x),
    "reduce_scatter": lambda c: c.reduce_scatter(x, -1),
    "gather": lambda c: c.gather(x, dst=1, dim=0),
}.items():
    ours, theirs = call(staged), call(base)
    results[name] = None if ours is None else ours.tolist()
    results[name + "_same"] = (ours is None and theirs is None) or torch.equal(ours, theirs)
target = x.clone()
results["broadcast_in_place"] = staged.broadcast(target, src=1) is target
results["broadcast"] = target.tolist()
if rank == 0:
    staged.send(x * 2)  # to the next rank by default
else:
    received = staged.recv((3, 4), torch.float32)  # from the previous rank by default
    results["recv"] = received.tolist()
    results["recv_device"] = str(received.device)
try:
    staged.recv((1,), torch.float32, src=rank)
except ValueError as error:
    results["recv_from_itself"] = str(error)
staged.barrier()
print(json.dumps(results))
# Drop the communicators (and their references to the group) before destroying it:
# a gloo group first released at interpreter exit aborts the process now and then.
del staged, base
dist.destroy_process_group()
"""


def documented_communicator() -> str:
    text = (ROOT / "docs" / "plugin-authors.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)
    (block,) = [b for b in blocks if "class HostStagedCommunicator(Communicator)" in b]
    return block


@pytest.mark.slow
def test_the_documented_host_staged_communicator_keeps_the_contract(tmp_path):
    (tmp_path / "staged.py").write_text(documented_communicator())
    (tmp_path / "worker.py").write_text(WORKER)
    port = free_port()
    finished = run_together(
        [
            ([sys.executable, str(tmp_path / "worker.py")], torchrun_env(rank, 2, port))
            for rank in range(2)
        ],
        timeout=180,
    )
    assert all(f.returncode == 0 for f in finished), [f.stderr[-3000:] for f in finished]
    first, second = (json.loads(f.stdout.splitlines()[-1]) for f in finished)
    for name in ("all_reduce", "all_gather_0", "all_gather_last", "reduce_scatter", "gather"):
        assert first[name + "_same"] and second[name + "_same"], name
    row = [float(v) for v in range(4)]
    assert first["all_reduce"][0] == [2 * v + 100 for v in row]
    assert first["gather"] is None and len(second["gather"]) == 6
    assert first["broadcast_in_place"] and second["broadcast_in_place"]
    assert (
        first["broadcast"]
        == second["broadcast"]
        == [[v + 100 for v in range(r * 4, r * 4 + 4)] for r in range(3)]
    )
    assert second["recv"] == [[2.0 * v for v in range(r * 4, r * 4 + 4)] for r in range(3)]
    assert second["recv_device"] == "cpu"
    for rank, results in enumerate((first, second)):
        assert f"src={rank} is not another rank of group 'world'" in results["recv_from_itself"]
