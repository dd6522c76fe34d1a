"""Calls one platform's probe several times in a fresh interpreter and reports, as JSON.

The probe check runs this as ``python -m slotwise.testing.conformance.probe_timing
NAME CALLS``: only a process that has not imported torch yet can tell whether the
probe imports it, and only a fresh one shows the cost of its first call.  Nothing
here imports torch.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from slotwise.platforms.resolution import get_resolver


def measure(name: str, calls: int) -> dict[str, Any]:
    """What ``calls`` consecutive probes of platform ``name`` answered and cost."""
    entries = get_resolver().entries
    if name not in entries:
        return {"error": f"no platform {name!r} is registered; known: {', '.join(entries)}"}
    probe = entries[name].spec.probe
    torch_before = "torch" in sys.modules
    answers: list[str] = []
    seconds: list[float] = []
    for _ in range(calls):
        start = time.perf_counter()
        try:
            answer = probe()
        except Exception as exc:  # noqa: BLE001 - the answer being reported
            answers.append(f"raised {type(exc).__name__}: {exc}")
        else:
            answers.append("True" if answer is True else repr(answer))
        seconds.append(time.perf_counter() - start)
    return {
        "answers": answers,
        "seconds": seconds,
        "torch_before": torch_before,
        "torch_after": "torch" in sys.modules,
    }


def main(argv: list[str]) -> int:
    name, calls = argv
    print(json.dumps(measure(name, int(calls))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
