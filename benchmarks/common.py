"""Helpers shared by the benchmark scripts in this folder.

Why: every benchmark reports the same way (a JSON file and a Markdown table under
``benchmarks/results/``, the table or the JSON on stdout, progress on stderr through the
``slotwise.benchmarks`` logger) and summarises noisy timings the same way (medians,
percentiles).  Keeping that here keeps the scripts about what they measure.

This module imports neither torch nor any of slotwise but ``slotwise.stats`` (which
imports nothing), so that a benchmark measuring start-up cost can use it without
disturbing what it measures.  The scripts are run as files (``python
benchmarks/<name>.py``), which puts this folder on ``sys.path``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from slotwise.stats import percentile

LOG = logging.getLogger("slotwise.benchmarks")

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "results"


def configure_logging(level: int = logging.INFO) -> None:
    """Progress messages go to stderr, so stdout carries only the table or the JSON."""
    logging.basicConfig(level=level, format="%(name)s: %(message)s", stream=sys.stderr)


#: The dtypes the decode benchmarks run a model in.
DTYPES = ("float32", "bfloat16", "float16")


def add_dtypes_arg(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--dtypes a,b``: a comma-separated list of ``DTYPES`` (default float32,bfloat16)."""

    def dtype_list(text: str) -> list[str]:
        names = [name for name in text.split(",") if name]
        unknown = sorted(set(names) - set(DTYPES))
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {unknown or [text]}; use a comma-separated list of {', '.join(DTYPES)}"
            )
        return names

    parser.add_argument(
        "--dtypes", type=dtype_list, default=["float32", "bfloat16"], help=help_text
    )


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark has: ``--out-dir`` and ``--json``."""
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="folder for the JSON and Markdown results (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")


def summary(samples: list[float], digits: int = 2) -> dict[str, float]:
    """Median, min, p90 and max of ``samples``, rounded to ``digits``."""
    return {
        "median": round(statistics.median(samples), digits),
        "min": round(min(samples), digits),
        "p90": round(percentile(samples, 90), digits),
        "max": round(max(samples), digits),
    }


def package_version(name: str) -> str | None:
    """Installed version of ``name`` from its metadata, without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions and machine facts that every report records."""
    return {
        "python_version": platform.python_version(),
        "torch_version": package_version("torch"),
        "slotwise_version": package_version("slotwise"),
        "machine": {
            "arch": platform.machine(),
            "cpu_count": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
        },
    }


def seconds_of(call: Callable[[], Any], before: Callable[[], Any] | None = None) -> float:
    """One call's seconds; ``before`` (a reset the timing must leave out) runs first."""
    if before is not None:
        before()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def utc_timestamp() -> str:
    """Now, in UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def verdict(ok: bool) -> str:
    """The word a Markdown report shows for a target."""
    return "PASS" if ok else "FAIL"


def write_outputs(name: str, report: dict[str, Any], markdown: str, out_dir: Path) -> None:
    """Write ``<name>.json`` and ``<name>.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(markdown)
    LOG.info("wrote %s", out_dir / f"{name}.{{json,md}}")


def emit(report: dict[str, Any], markdown: str, as_json: bool) -> None:
    """Print the report: the JSON with ``--json``, else the Markdown."""
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(markdown, end="")


def publish(
    name: str,
    report: dict[str, Any],
    markdown: str,
    args: argparse.Namespace,
    profile_text: str | None = None,
) -> None:
    """What every benchmark ends with: ``<name>.json`` and ``<name>.md`` written under
    ``--out-dir`` (and ``<name>_profile.txt`` when profiled), then the report printed
    (``--json`` or Markdown)."""
    write_outputs(name, report, markdown, args.out_dir)
    if profile_text is not None:
        path = args.out_dir / f"{name}_profile.txt"
        path.write_text(profile_text)
        LOG.info("wrote %s", path)
    emit(report, markdown, args.json)


def require_positive(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str
) -> None:
    """Refuse, as argparse refuses, any of the integer options ``names`` below 1."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
