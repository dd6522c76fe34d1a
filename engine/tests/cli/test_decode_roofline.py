"""The decode benchmark's memory roofline: the 1B preset's bytes per step, the read
probe (injected here, as a GPU run's CUDA-event probe would be), and the rooflines
every measurement is set against."""

from __future__ import annotations

import pytest
import torch

from slotwise.attention import allocate_kv_caches
from slotwise.compilation import CompilationConfig
from slotwise.platforms import get_current_platform
from slotwise_engine.bench import decode as decode_benchmark
from slotwise_engine.bench.decode import ReadBandwidth, bytes_per_step, measure_read_bandwidth
from slotwise_engine.models.llama import PRESETS, LlamaForCausalLM

#: Llama-3.2-1B's published parameter count (tied embeddings: the LM head is the table).
LLAMA_3_2_1B_PARAMETERS = 1_235_814_400


def test_the_1b_preset_has_llama_3_2_1b_shapes():
    c = PRESETS["1b"]
    shapes = (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_size)
    assert shapes == (2048, 16, 32, 8, 64)
    assert (c.intermediate_size, c.vocab_size, c.tie_word_embeddings) == (8192, 128256, True)


def test_a_1b_decode_step_reads_every_weight_and_each_requests_keys_and_values():
    model = LlamaForCausalLM.on_meta(
        PRESETS["1b"],
        dtype=torch.bfloat16,
        compilation_config=CompilationConfig(level=0),
    )
    allocate_kv_caches(model, 8, device="meta")
    seq_lens = [33, 10]
    # Per token and layer: keys and values of 8 heads of 64, in bfloat16.
    kv = sum(seq_lens) * 16 * 2 * 8 * 64 * 2
    assert bytes_per_step(model, seq_lens) == LLAMA_3_2_1B_PARAMETERS * 2 + kv


def test_the_probe_times_each_read_with_the_timer_it_is_given():
    calls = []

    def timer(work):
        calls.append(work)
        return 0.25

    probe = measure_read_bandwidth(4096, device="cpu", repeats=3, timer=timer)
    assert len(calls) == 3 and all(callable(work) for work in calls)
    assert probe.probe_bytes == decode_benchmark.PROBE_MIN_BYTES
    assert probe.bytes_per_second == probe.probe_bytes / 0.25


def test_on_the_cpu_a_read_is_timed_on_the_host_until_the_platform_synchronises(monkeypatch):
    platform = get_current_platform()
    order = []
    monkeypatch.setattr(platform, "synchronize", lambda **kwargs: order.append("synchronize"))
    seconds = decode_benchmark.device_timer("cpu")(lambda: order.append("work"))
    assert order == ["work", "synchronize"] and seconds >= 0


def test_a_cuda_probe_reads_gigabytes_past_any_l2_cache():
    low, high = decode_benchmark.probe_bounds("cuda")
    assert 2 * 2**30 <= low <= high
    assert decode_benchmark.probe_bounds("cpu") == (
        decode_benchmark.PROBE_MIN_BYTES,
        decode_benchmark.PROBE_MAX_BYTES,
    )


def test_every_measurement_is_set_against_the_injected_probe():
    asked = []

    def probe(nbytes: int) -> ReadBandwidth:
        asked.append(nbytes)
        return ReadBandwidth(
            bytes_per_second=2e9 if len(asked) == 1 else 1e9, probe_bytes=nbytes, threads=1
        )

    result = decode_benchmark.run_benchmark(
        "tiny",
        [1, 3],
        CompilationConfig(backend="eager"),
        variants=["eager", "level3"],
        prompt_len=8,
        iterations=2,
        warmups=1,
        progress=False,
        read_probe=probe,
    )
    # Once before the first timed step and once after the last, sized to the largest step.
    assert asked == [max(m.bytes_per_step for m in result.measurements)] * 2
    assert result.read_bandwidth.bytes_per_second == 2e9
    assert result.read_bandwidth_after.bytes_per_second == 1e9
    assert {(m.variant, m.batch_size) for m in result.measurements} == {
        ("eager", 1), ("eager", 3), ("level3", 1), ("level3", 3)
    }  # fmt: skip
    for m in result.measurements:
        assert m.roofline_ms == pytest.approx(m.bytes_per_step / 2e9 * 1e3)
        assert m.roofline_fraction == pytest.approx(m.roofline_ms / m.p50_ms)
    assert result.default_graph_mode["mode"] == "NONE"  # the CPU has no static graphs
