"""The capture step every graph platform uses: a ``GraphDispatcher``'s capture plan, all
sizes, largest first.

Largest first, because graphs captured later (smaller) then fit into memory the
pool already holds, instead of each growing it.  Time and memory are reported per
size; afterwards the capture window is closed, so a size that was missed surfaces
as an error instead of a capture in the middle of serving.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby

from tqdm import tqdm

from slotwise.compilation.compile_counters import counters
from slotwise.compilation.static_graphs.contract import capture_window
from slotwise.compilation.static_graphs.dispatcher import CaptureCase
from slotwise.platforms import Platform

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureReport:
    size: int
    seconds: float
    memory_bytes: int | None  # growth of device memory in use; None if not reported
    #: Static graphs captured for this size (the pieces', the whole model's), as counted
    #: by ``num_graphs_captured``; 0 where the size's graphs existed already.
    graphs: int


def capture_graphs(
    run_case: Callable[[CaptureCase], object],
    plan: Sequence[CaptureCase],
    platform: Platform,
    *,
    runs_per_size: int,
    progress: bool = True,
) -> list[CaptureReport]:
    """Run ``run_case`` on every case of ``plan`` (``GraphDispatcher.capture_plan``)
    ``runs_per_size`` times inside the capture window, size by size, largest first.

    ``runs_per_size`` is the config's ``graph_warmups`` plus one: the warm-ups, then
    the run that captures.
    """
    by_size = sorted(plan, key=lambda case: case.size, reverse=True)
    cases = {size: list(group) for size, group in groupby(by_size, lambda case: case.size)}
    reports = []
    with capture_window():
        bar = tqdm(cases, desc="capturing graphs", unit="size", disable=not progress)
        for size in bar:
            before = _memory(platform)
            captured = counters.num_graphs_captured
            start = time.perf_counter()
            for _ in range(runs_per_size):
                for case in cases[size]:
                    run_case(case)
            platform.synchronize()
            seconds = time.perf_counter() - start
            after = _memory(platform)
            growth = None if before is None or after is None else after - before
            graphs = counters.num_graphs_captured - captured
            reports.append(CaptureReport(size, seconds, growth, graphs))
            bar.set_postfix(size=size, ms=f"{seconds * 1e3:.1f}")
    total = sum(report.seconds for report in reports)
    graphs = sum(report.graphs for report in reports)
    logger.info("captured %d graphs for %d sizes in %.2f s", graphs, len(reports), total)
    return reports


def _memory(platform: Platform) -> int | None:
    try:
        return platform.current_memory_usage()
    except NotImplementedError:
        return None
