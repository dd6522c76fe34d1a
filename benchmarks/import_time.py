"""Measure how much start-up time ``import slotwise`` adds to a Python process.

Why: slotwise is imported by CLIs and by plugin entry points that may never touch a
device, so resolving ``slotwise.current_platform`` must stay cheap and must not pull in
torch. This script times three commands, each run as a fresh subprocess of the current
interpreter (``sys.executable``):

* ``python -c "pass"``: bare interpreter start-up (baseline);
* ``python -c "import slotwise; slotwise.current_platform.name"``: import and resolve,
  plugins found through ``importlib.metadata`` as in every process;
* ``python -c "import torch"``: for scale, what an eager torch import would cost.

Each command gets untimed warm-up runs, then ``--runs`` timed runs, interleaved
round-robin so that machine noise hits all commands alike. The overhead of slotwise is
the difference of medians against the baseline; the target is at most 100 ms, a small
part of the torch import every model run pays. The subprocesses run without any
``SLOTWISE_*`` variable (so the cpu platform resolves) and without
``PYTHONDONTWRITEBYTECODE`` (so cached bytecode is used, as in normal use). The load
average before and after is recorded: on a shared machine it explains much of the spread.

It also runs ``python -X importtime`` once to list the modules with the largest
cumulative import time, and checks in a subprocess that ``torch`` is not in
``sys.modules`` after resolving the platform.

Results go to ``<out-dir>/import_time.json`` and ``<out-dir>/import_time.md``; the
Markdown table (or the JSON with ``--json``) is printed to stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from common import (
    LOG,
    add_output_args,
    configure_logging,
    environment,
    percentile,
    publish,
    utc_timestamp,
    verdict,
)

TARGET_MS = 100.0
DEFAULT_RUNS = 15
WARMUP_RUNS = 2
TOP_IMPORTS = 10

RESOLVE_CODE = "import slotwise; slotwise.current_platform.name"
#: name -> the code ``python -c`` runs
COMMANDS: dict[str, str] = {
    "python": "pass",
    "slotwise": RESOLVE_CODE,
    "torch": "import torch",
}
TORCH_CHECK_CODE = RESOLVE_CODE + "; import sys; print('torch' in sys.modules)"


@dataclass
class Stats:
    """Timing summary of one command, in milliseconds."""

    command: str
    median_ms: float
    min_ms: float
    p90_ms: float


@dataclass
class ImportEntry:
    """One line of ``-X importtime`` output, in milliseconds."""

    module: str
    depth: int
    self_ms: float
    cumulative_ms: float


def clean_env() -> dict[str, str]:
    """Return the current environment without SLOTWISE_* and PYTHONDONTWRITEBYTECODE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the current interpreter with ``args``; raise if it fails."""
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, check=True
    )


def time_once(code: str, env: dict[str, str]) -> float:
    """Wall time in milliseconds of one ``python -c code`` subprocess."""
    start = time.perf_counter()
    run_python(["-c", code], env)
    return (time.perf_counter() - start) * 1000.0


def summarize(command: str, samples: list[float]) -> Stats:
    """Median, min and p90 of a list of timings."""
    return Stats(
        command=command,
        median_ms=round(statistics.median(samples), 2),
        min_ms=round(min(samples), 2),
        p90_ms=round(percentile(samples, 90), 2),
    )


def measure(runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Warm up, then time every command ``runs`` times, round-robin."""
    LOG.info("warming up (%d runs per command)", WARMUP_RUNS)
    for _ in range(WARMUP_RUNS):
        for code in COMMANDS.values():
            time_once(code, env)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for i in range(runs):
        LOG.info("round %d/%d", i + 1, runs)
        for name, code in COMMANDS.items():
            samples[name].append(time_once(code, env))
    return samples


def parse_importtime(stderr: str) -> list[ImportEntry]:
    """Parse ``import time: self [us] | cumulative | imported package`` lines."""
    entries: list[ImportEntry] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        fields = line[len("import time:") :].split("|")
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue  # the header line
        name = fields[2].rstrip()
        stripped = name.lstrip()
        entries.append(
            ImportEntry(
                module=stripped,
                depth=(len(name) - len(stripped)) // 2,
                self_ms=int(fields[0]) / 1000.0,
                cumulative_ms=int(fields[1]) / 1000.0,
            )
        )
    return entries


def top_imports(env: dict[str, str], count: int = TOP_IMPORTS) -> list[ImportEntry]:
    """The ``count`` modules with the largest cumulative import time."""
    LOG.info("running -X importtime")
    result = run_python(["-X", "importtime", "-c", RESOLVE_CODE], env)
    entries = parse_importtime(result.stderr)
    return sorted(entries, key=lambda e: e.cumulative_ms, reverse=True)[:count]


def torch_imported(env: dict[str, str]) -> bool:
    """Whether resolving the platform leaves ``torch`` in ``sys.modules``."""
    LOG.info("checking sys.modules for torch")
    result = run_python(["-c", TORCH_CHECK_CODE], env)
    return result.stdout.strip().splitlines()[-1] == "True"


def build_report(runs: int) -> dict[str, object]:
    """Run every measurement and collect the results into one dict."""
    env = clean_env()
    load_before = os.getloadavg()
    samples = measure(runs, env)
    load_after = os.getloadavg()
    stats = {name: summarize(COMMANDS[name], s) for name, s in samples.items()}
    baseline = stats["python"].median_ms
    overhead = round(stats["slotwise"].median_ms - baseline, 2)
    return {
        **environment(),
        "runs": runs,
        "warmup_runs": WARMUP_RUNS,
        "load_average": {"before": load_before, "after": load_after},
        "stats": {name: asdict(s) for name, s in stats.items()},
        "overhead_ms": overhead,
        "target_ms": TARGET_MS,
        "meets_target": overhead <= TARGET_MS,
        "torch_imported": torch_imported(env),
        "top_imports": [asdict(e) for e in top_imports(env)],
        "timestamp": utc_timestamp(),
    }


def render_markdown(report: dict[str, object]) -> str:
    """A Markdown table of the timings, followed by the verdict lines."""
    lines = [
        "| command | median (ms) | min (ms) | p90 (ms) |",
        "|---|---:|---:|---:|",
    ]
    stats: dict[str, dict[str, object]] = report["stats"]  # type: ignore[assignment]
    for s in stats.values():
        lines.append(
            f'| `python -c "{s["command"]}"` | {s["median_ms"]:.1f} '
            f"| {s['min_ms']:.1f} | {s['p90_ms']:.1f} |"
        )
    load: dict[str, list[float]] = report["load_average"]  # type: ignore[assignment]
    lines += [
        "",
        f"slotwise overhead (median difference): {report['overhead_ms']:.1f} ms "
        f"(target <= {report['target_ms']:.0f} ms): **{verdict(report['meets_target'])}**",
        f"torch imported after resolving: {report['torch_imported']}",
        "load average (1, 5, 15 min) before: "
        + ", ".join(f"{x:.2f}" for x in load["before"])
        + "; after: "
        + ", ".join(f"{x:.2f}" for x in load["after"]),
        f"runs: {report['runs']}, python {report['python_version']}, "
        f"torch {report['torch_version']}",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="timed runs per command")
    add_output_args(parser)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    configure_logging()
    args = parse_args(argv)
    report = build_report(args.runs)
    markdown = render_markdown(report)
    publish("import_time", report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
