"""Check ``probe``: the platform's probe is cheap, idempotent and free of device contexts.

Every process that resolves a platform runs the probes of the installed plugins,
often before it forks workers.  A probe that imports torch or touches the device
(``torch.cuda.is_available()``, a tensor) costs seconds and can leave a device
context that breaks every ``fork`` after it; the rule (docs/design.md) is to read device
files or NVML instead.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any

from slotwise.platforms.resolution import get_resolver
from slotwise.testing.conformance import target

#: Consecutive calls in one process; every one must answer True.
CALLS = 5
#: The most one call may take, in seconds.
BUDGET_S = 0.1


@functools.cache
def measurement() -> dict[str, Any]:
    """The probe measured in a fresh interpreter that loads only this platform's plugin."""
    name = target.platform_name()
    plugin = get_resolver().entries[name].plugin
    env = {**os.environ, "SLOTWISE_PLUGINS": plugin.name}
    command = [sys.executable, "-m", "slotwise.testing.conformance.probe_timing", name, str(CALLS)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    lines = result.stdout.strip().splitlines()
    if result.returncode or not lines:
        target.fail(f"measuring the probe in a subprocess failed:\n{result.stderr[-2000:]}")
    report = json.loads(lines[-1])
    if "error" in report:
        target.fail(f"measuring the probe in a subprocess failed: {report['error']}")
    return report


def test_probe_answers_true_every_time() -> None:
    answers = measurement()["answers"]
    if any(answer != "True" for answer in answers):
        target.fail(
            f"probe() answered {', '.join(answers)} over {CALLS} calls in one process; a probe "
            "must be idempotent and answer True wherever its platform is selected"
        )


def test_probe_is_cheap() -> None:
    seconds = measurement()["seconds"]
    if max(seconds) >= BUDGET_S:
        calls = ", ".join(f"{s * 1000:.1f} ms" for s in seconds)
        target.fail(
            f"probe() took up to {max(seconds) * 1000:.0f} ms (calls: {calls}); it runs in every "
            f"process that resolves a platform and must finish within {BUDGET_S * 1000:.0f} ms: "
            "read device files or NVML, do not import torch or a device SDK"
        )


def test_probe_does_not_import_torch() -> None:
    report = measurement()
    plugin = get_resolver().entries[target.platform_name()].plugin
    if report["torch_before"]:
        target.fail(
            f"loading {plugin.label} imported torch before its probe ran; plugin entry "
            "modules must not import torch (import it inside the methods that need it)"
        )
    if report["torch_after"]:
        target.fail(
            "probe() imported torch, so it can initialise a device (a CUDA context breaks "
            "every fork after it); probes must read device files or NVML, not torch"
        )
