"""Resident tensors (the weights, the KV cache) moved onto transparent huge pages.

Why: a decode step streams every weight and its requests' keys and values from memory
once.  On 4 KiB pages the CPU needs a page-table walk every 4 KiB, and its prefetchers
stop at each page boundary; on 2 MiB pages both go away.  On an AMD EPYC (Zen 4) a
level-3 batch-1 step ran 1.27x (float32) and 1.29x (bfloat16) faster this way
(docs/cpu-kernels.md).

How: ``madvise(MADV_HUGEPAGE)`` marks each huge page the tensors touch, and
``madvise(MADV_COLLAPSE)`` (Linux 6.1) moves what is already there onto one huge page
in place: the same addresses and values, so compiled code and captured graphs never
notice.  Memory not yet written (weights given memory before a checkpoint is read into
them) has nothing to move; marked, it is given huge pages as it is first written.

A huge page at a tensor's edge also holds its neighbours' bytes, which move with it
unchanged; one that reaches past a mapping of anonymous memory (into a file mapping, a
gap, or the next mapping) is left alone.  Where the kernel refuses (huge pages switched
off, a kernel before 6.1, memory too fragmented), the tensors stay where they were and
a warning says why.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import ctypes
import errno
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import torch

logger = logging.getLogger("slotwise")

#: Linux's madvise advice codes (uapi/asm-generic/mman-common.h).
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
#: The kernel's transparent huge page settings.
THP_SETTINGS = Path("/sys/kernel/mm/transparent_hugepage")
#: This process's memory mappings, and the state of each of its pages.
MAPPINGS = Path("/proc/self/maps")
PAGEMAP = Path("/proc/self/pagemap")

#: ``madvise(address, length, advice)`` returning 0, or the errno of a refusal.
Madvise = Callable[[int, int, int], int]

_REASONS = {
    errno.EINVAL: "the kernel refused MADV_COLLAPSE (it needs Linux 6.1 or later)",
    errno.EAGAIN: "no free huge page could be had; the kernel may still move them later",
    errno.ENOMEM: "memory is too fragmented or too scarce for huge pages",
}


@dataclass
class HugePageReport:
    """What one call moved: huge pages asked for, moved, and the refusals by errno."""

    page_size: int
    pages: int = 0
    moved: int = 0
    #: Pages with nothing written yet: marked, they become huge pages when written.
    marked: int = 0
    #: Pages that reach past a mapping of anonymous memory, left as they are.
    skipped: int = 0
    refusals: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0


def huge_page_size(settings: Path = THP_SETTINGS) -> int:
    """The size of a transparent huge page here, 0 where the kernel has none."""
    try:
        return int((settings / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 0


def huge_pages_mode(settings: Path = THP_SETTINGS) -> str | None:
    """The chosen transparent huge page mode ("always", "madvise", "never"), or None."""
    try:
        text = (settings / "enabled").read_text()
    except OSError:
        return None
    chosen = [word[1:-1] for word in text.split() if word.startswith("[")]
    return chosen[0] if chosen else None


def anonymous_spans(maps: str) -> list[tuple[int, int]]:
    """The (start, end) address ranges of private, writable, anonymous memory (the heap
    and unnamed mappings) in ``maps`` (the text of ``/proc/<pid>/maps``).

    Adjacent ranges stay apart: the kernel collapses a huge page only inside one
    mapping, and two neighbours it kept apart differ in more than their advice."""
    spans: list[tuple[int, int]] = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        name = fields[5].strip() if len(fields) == 6 else ""
        if fields[1][:2] != "rw" or fields[1][3] != "p" or fields[4] != "0":
            continue
        if name not in ("", "[heap]"):
            continue
        start, end = (int(bound, 16) for bound in fields[0].split("-"))
        spans.append((start, end))
    return spans


def pages_touched(tensors: Sequence[torch.Tensor], page_size: int) -> list[int]:
    """The start of every huge page that a byte of a CPU tensor's storage lies on, in order."""
    starts: set[int] = set()
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        if address == 0 or nbytes == 0:
            continue
        first = address - address % page_size
        starts.update(range(first, address + nbytes, page_size))
    return sorted(starts)


def written(pagemap: BinaryIO, address: int, length: int) -> bool:
    """Whether any base page of ``[address, address + length)`` is in memory or swap
    (bits 63 and 62 of its entry in ``pagemap``, this process's ``/proc/self/pagemap``
    open for reading, which needs no privileges)."""
    base = os.sysconf("SC_PAGE_SIZE")
    pagemap.seek(address // base * 8)
    states = array.array("Q", pagemap.read(length // base * 8))
    return any(state >> 62 for state in states)


@functools.cache  # one libc handle for every call
def _libc_madvise() -> Madvise:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int

    def madvise(address: int, length: int, advice: int) -> int:
        return 0 if libc.madvise(address, length, advice) == 0 else ctypes.get_errno()

    return madvise


def move_to_huge_pages(
    tensors: Sequence[torch.Tensor],
    page_size: int,
    madvise: Madvise,
    spans: Sequence[tuple[int, int]],
) -> HugePageReport:
    """Mark and collapse, one huge page at a time, every page the tensors lie on that
    lies inside one of ``spans`` (mappings of anonymous memory)."""
    report = HugePageReport(page_size)
    start = time.perf_counter()
    starts = [span_start for span_start, _ in spans]
    with contextlib.ExitStack() as stack:
        pagemap: BinaryIO | None = None  # opened at the first page that may be unwritten
        for address in pages_touched(tensors, page_size):
            report.pages += 1
            index = bisect.bisect_right(starts, address) - 1
            if index < 0 or address + page_size > spans[index][1]:
                report.skipped += 1
                continue
            refusal = madvise(address, page_size, MADV_HUGEPAGE) or madvise(
                address, page_size, MADV_COLLAPSE
            )
            if refusal == errno.EAGAIN:  # a page was busy for a moment (the kernel's word)
                refusal = madvise(address, page_size, MADV_COLLAPSE)
            if refusal == errno.EINVAL:
                if pagemap is None:
                    pagemap = stack.enter_context(PAGEMAP.open("rb"))
                if not written(pagemap, address, page_size):
                    report.marked += 1  # the kernel collapses only what is there
                    continue
            if refusal:
                report.refusals[refusal] = report.refusals.get(refusal, 0) + 1
            else:
                report.moved += 1
    report.seconds = time.perf_counter() - start
    return report


@functools.cache  # once per process: every model and cache would say the same
def _warn_huge_pages_off(enabled: Path, mode: str | None) -> None:
    logger.warning(
        "transparent huge pages are off here (%s is %s): the weights and KV cache stay on "
        "4 KiB pages, which decode reads about 1.3x slower. To allow them: "
        "echo madvise | sudo tee %s",
        enabled,
        repr(mode) if mode else "missing",
        enabled,
    )


def advise(
    tensors: Sequence[torch.Tensor],
    *,
    settings: Path = THP_SETTINGS,
    maps: Path = MAPPINGS,
    madvise: Madvise | None = None,
) -> HugePageReport | None:
    """Move ``tensors`` onto huge pages where this machine allows it, warning where it
    does not; None where nothing was tried (not Linux, huge pages off)."""
    if sys.platform != "linux":
        logger.debug("huge pages are Linux's; resident tensors stay on base pages")
        return None
    page_size = huge_page_size(settings)
    mode = huge_pages_mode(settings)
    if page_size == 0 or mode in (None, "never"):
        _warn_huge_pages_off(settings / "enabled", mode)
        return None
    spans = anonymous_spans(maps.read_text())
    report = move_to_huge_pages(tensors, page_size, madvise or _libc_madvise(), spans)
    mib = report.page_size / 2**20
    if report.refusals:
        reasons = "; ".join(
            f"{count} pages: {_REASONS.get(code, os.strerror(code))}"
            for code, count in sorted(report.refusals.items())
        )
        logger.warning(
            "%d of %d huge pages (%.0f MiB each) of the weights and KV cache stayed on 4 KiB "
            "pages, which decode reads about 1.3x slower: %s",
            sum(report.refusals.values()),
            report.pages,
            mib,
            reasons,
        )
    # Moving costs the kernel about 0.3 to 0.6 s a GB here: long enough to say so.
    logger.log(
        logging.INFO if report.seconds >= 1 else logging.DEBUG,
        "%.0f MiB of resident tensors moved onto huge pages in %.2f s, %.0f MiB to be "
        "given them when written; %d pages at their edges reach past a mapping of anonymous "
        "memory and stay as they are",
        report.moved * mib,
        report.seconds,
        report.marked * mib,
        report.skipped,
    )
    return report
