"""What each rank of the rank-agreement test runs: ``rank_agreement_worker.py CHECKS OUT_DIR``.

CHECKS is a JSON file: a list of checks, each a list of facts ``[name, data, shown,
fix]`` (this rank's).  The rank joins one tensor-parallel group of the whole job,
runs ``check_ranks_agree`` once per check, in order, and writes
``OUT_DIR/rank<r>.json``: per check, the error class and message, or nulls when the
ranks agreed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import slotwise.distributed as sd


def main() -> None:
    checks_file, out_dir = sys.argv[1:]
    checks = json.loads(Path(checks_file).read_text())
    info = sd.init_distributed(tensor_parallel_size=int(os.environ["WORLD_SIZE"]))
    results = []
    try:
        for facts in checks:
            try:
                sd.check_ranks_agree(
                    sd.get_tp_communicator(),
                    [sd.Fact(name, data.encode(), shown, fix) for name, data, shown, fix in facts],
                )
                results.append({"error": None, "message": None})
            except sd.DistributedError as error:
                results.append({"error": type(error).__name__, "message": str(error)})
    finally:
        sd.shutdown_distributed()
    (Path(out_dir) / f"rank{info.rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
