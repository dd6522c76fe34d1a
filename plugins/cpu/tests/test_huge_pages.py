"""The CPU platform's ``advise_resident_memory``: weights and KV cache on huge pages.

Oracle: the kernel's own account of this process's memory (``AnonHugePages`` in
``/proc/self/smaps``), before and after; addresses and values must not change.  The
refusals a kernel can answer with are injected through ``madvise``.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from pathlib import Path

import pytest
import torch

from slotwise.attention import Attention
from slotwise.compilation.config import CompilationConfig
from slotwise.platforms import get_current_platform
from slotwise_cpu import huge_pages
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner

MIB = 2**20


def _kernel_moves_pages() -> str | None:
    """Why this machine cannot collapse pages, or None when it can."""
    if sys.platform != "linux":
        return "huge pages are Linux's"
    if huge_pages.huge_pages_mode() in (None, "never"):
        return "transparent huge pages are off on this machine"
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    if (major, minor) < (6, 1):
        return "MADV_COLLAPSE needs Linux 6.1"
    return None


needs_collapse = pytest.mark.skipif(
    _kernel_moves_pages() is not None, reason=str(_kernel_moves_pages())
)


def huge_bytes(tensor: torch.Tensor) -> int:
    """Bytes on huge pages in the mappings that hold ``tensor``, as the kernel counts them."""
    start = tensor.untyped_storage().data_ptr()
    end = start + tensor.untyped_storage().nbytes()
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            inside = low < end and start < high
        elif inside and fields[0] == "AnonHugePages:":
            total += int(fields[1]) * 1024
    return total


def interior_bytes(tensor: torch.Tensor, page_size: int) -> int:
    """Bytes of the whole huge pages inside ``tensor``'s storage."""
    start = tensor.untyped_storage().data_ptr()
    end = start + tensor.untyped_storage().nbytes()
    first = -(-start // page_size) * page_size
    return max(0, (end - end % page_size) - first)


@needs_collapse
def test_a_tensor_moves_onto_huge_pages_at_the_same_address_with_the_same_values():
    tensor = torch.randn(12 * MIB // 4, generator=torch.Generator().manual_seed(0))
    expected, address, before = tensor.clone(), tensor.data_ptr(), huge_bytes(tensor)
    report = huge_pages.advise([tensor])
    assert report is not None and not report.refusals
    assert tensor.data_ptr() == address and torch.equal(tensor, expected)
    page_size = huge_pages.huge_page_size()
    assert huge_bytes(tensor) - before >= interior_bytes(tensor, page_size) >= 8 * MIB


@needs_collapse
def test_the_runner_puts_the_weights_and_the_kv_cache_on_huge_pages():
    model = build_llama("small", dtype=torch.float32, compilation_config=CompilationConfig())
    embedding = model.model.embed_tokens.weight  # 16 MiB
    before = huge_bytes(embedding)
    ModelRunner(model, num_blocks=256)  # 8 MiB of keys and values per layer
    page_size = huge_pages.huge_page_size()
    assert huge_bytes(embedding) - before >= interior_bytes(embedding, page_size) > 0
    for layer in model.modules():
        if isinstance(layer, Attention):
            assert huge_bytes(layer.kv_cache) >= interior_bytes(layer.kv_cache, page_size) > 0


def test_the_bandwidth_probe_reads_memory_the_platform_was_told_about(monkeypatch):
    """The roofline's probe is mapped the way the weights it stands for are."""
    from slotwise_engine.bench import decode as decode_benchmark

    advised: list[int] = []
    platform = get_current_platform()
    monkeypatch.setattr(
        platform, "advise_resident_memory", lambda tensors: advised.extend(map(len, tensors))
    )
    probe = decode_benchmark.measure_read_bandwidth(4096, device="cpu", repeats=2)
    assert advised == [probe.probe_bytes // 4]


def fake_settings(tmp_path: Path, mode: str) -> Path:
    choices = " ".join(f"[{m}]" if m == mode else m for m in ("always", "madvise", "never"))
    (tmp_path / "enabled").write_text(choices + "\n")
    (tmp_path / "hpage_pmd_size").write_text(f"{2 * MIB}\n")
    return tmp_path


@pytest.mark.skipif(sys.platform != "linux", reason="huge pages are Linux's")
def test_a_kernel_without_collapse_is_a_warning_with_the_reason(tmp_path, caplog):
    def madvise(address: int, length: int, advice: int) -> int:
        return errno.EINVAL if advice == huge_pages.MADV_COLLAPSE else 0

    tensor = torch.ones(6 * MIB // 4)
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        report = huge_pages.advise(
            [tensor], settings=fake_settings(tmp_path, "madvise"), madvise=madvise
        )
    assert report is not None and report.moved == 0
    assert report.refusals == {errno.EINVAL: report.pages - report.skipped} and report.pages >= 3
    assert "stayed on 4 KiB pages" in caplog.text and "Linux 6.1" in caplog.text
    assert bool((tensor == 1).all())


@pytest.mark.skipif(sys.platform != "linux", reason="huge pages are Linux's")
def test_a_busy_page_is_tried_once_more(tmp_path, caplog):
    answers = {huge_pages.MADV_COLLAPSE: [errno.EAGAIN]}

    def madvise(address: int, length: int, advice: int) -> int:
        pending = answers.get(advice, [])
        return pending.pop() if pending else 0

    with caplog.at_level(logging.WARNING, logger="slotwise"):
        report = huge_pages.advise(
            [torch.ones(6 * MIB // 4)], settings=fake_settings(tmp_path, "madvise"), madvise=madvise
        )
    assert report is not None and report.moved == report.pages - report.skipped >= 2
    assert not report.refusals and caplog.text == ""


@pytest.mark.skipif(sys.platform != "linux", reason="huge pages are Linux's")
def test_huge_pages_switched_off_are_a_warning_with_the_fix(tmp_path, caplog):
    def madvise(address: int, length: int, advice: int) -> int:
        raise AssertionError("madvise must not be called with huge pages off")

    settings = fake_settings(tmp_path, "never")
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        for _ in range(3):  # a model, its cache, the probe: one warning
            assert huge_pages.advise([torch.ones(1024)], settings=settings, madvise=madvise) is None
    assert len(caplog.records) == 1
    assert "'never'" in caplog.text and "echo madvise | sudo tee" in caplog.text


def test_pages_touched_cover_every_byte_of_each_storage_once():
    page = 4096
    base = torch.zeros(5 * page // 4 + 3)
    views = [base[7:], base[100:200], torch.zeros(3), torch.empty(8, device="meta")]
    starts = huge_pages.pages_touched(views, page)
    assert starts == sorted(set(starts)) and all(start % page == 0 for start in starts)
    for tensor in (base, views[2]):
        storage = tensor.untyped_storage()
        for byte in (storage.data_ptr(), storage.data_ptr() + storage.nbytes() - 1):
            assert byte - byte % page in starts
    assert set(huge_pages.pages_touched([base], page)) <= set(starts)
    assert huge_pages.pages_touched([views[3]], page) == []


def test_only_private_writable_anonymous_memory_counts():
    maps = "\n".join(
        [
            "00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/python3",
            "01000000-01200000 rw-p 00000000 00:00 0           [heap]",
            "01200000-01400000 rw-p 00000000 00:00 0 ",
            "7f0000000000-7f0000200000 rw-s 00000000 00:05 4242 /dev/shm/x",
            "7f0000200000-7f0000400000 rw-p 00000000 08:02 173600 /data/weights.bin",
            "7f0000400000-7f0000600000 rw-p 00000000 00:00 0",
            "7f0000600000-7f0000800000 ---p 00000000 00:00 0",
            "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0           [stack]",
        ]
    )
    assert huge_pages.anonymous_spans(maps) == [
        (0x01000000, 0x01200000),
        (0x01200000, 0x01400000),
        (0x7F0000400000, 0x7F0000600000),
    ]


@needs_collapse
def test_memory_not_yet_written_is_given_huge_pages_as_it_is_written():
    """What the loader relies on: weights advised before the checkpoint is read into
    them have no pages to move, and take huge pages from the first write on."""
    # Above glibc's largest mmap threshold (32 MiB): a fresh mapping, nothing written.
    tensor = torch.empty(40 * MIB // 4)
    report = huge_pages.advise([tensor])
    # Marked, mostly; where the address range held an earlier mapping whose page tables
    # the kernel kept, it collapses the empty range into zeroed huge pages at once (seen
    # on Linux 6.18 once in a run of the whole folder): huge pages either way.
    assert report is not None and not report.refusals
    assert report.marked + report.moved >= 18
    tensor.fill_(3.0)
    page_size = huge_pages.huge_page_size()
    assert huge_bytes(tensor) >= interior_bytes(tensor, page_size) >= 36 * MIB
