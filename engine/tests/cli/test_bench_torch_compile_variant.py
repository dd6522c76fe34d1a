"""`slotwise bench`'s torch.compile variants compile as the platform does: with its default
compile backend, or, where it cannot (torch.compile switched off, Inductor without a code
generator for the device, a mode only Inductor has), skipped by default with the reason in
the report, and refused in one line when asked for by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import clean_env
from torch._dynamo.utils import counters as dynamo_counters

from slotwise.compilation.config import CompilationConfig
from slotwise.platforms import use_platform
from slotwise_ascend_stub.platform import AscendStubPlatform
from slotwise_engine.bench import decode as decode_benchmark
from slotwise_engine.bench.decode import ReadBandwidth

DISABLED = "TORCH_COMPILE_DISABLE=1 switches torch.compile off"


def bench(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotwise", "bench", "--preset", "tiny", "--json", *args],
        capture_output=True,
        text=True,
        env=clean_env(SLOTWISE_DISABLE_COMPILE_CACHE="1", **env),
        timeout=600,
    )


class InductorByDefaultOnMeta(AscendStubPlatform):
    """A platform naming Inductor its default for a device type Inductor cannot target."""

    device_type = "meta"
    default_compile_backend = "inductor"


@pytest.mark.slow
def test_under_torch_compile_disable_the_default_variants_skip_torch_compile_and_say_why():
    result = bench("--batch-sizes", "1", "--iterations", "1", TORCH_COMPILE_DISABLE="1")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["skipped_variants"] == {"torch.compile": DISABLED}
    assert {m["variant"] for m in report["measurements"]} == {"eager", "level3"}
    assert f"WARNING slotwise: variant torch.compile is skipped: {DISABLED}" in result.stderr


@pytest.mark.slow
def test_under_torch_compile_disable_asking_for_torch_compile_is_refused_in_one_line():
    result = bench("--variants", "eager,torch.compile", TORCH_COMPILE_DISABLE="1")
    assert result.returncode == 1
    assert result.stderr == (
        f"slotwise bench: variant 'torch.compile' cannot run here: {DISABLED}; drop it from "
        "--variants\n"
    )


@pytest.mark.slow
def test_torch_compile_compiles_with_the_platforms_default_backend_eager():
    platform = AscendStubPlatform()
    assert platform.default_compile_backend == "eager"
    graphs = dynamo_counters["stats"]["unique_graphs"]
    aot_compiles = dynamo_counters["aot_autograd"]["total"]
    with use_platform(platform):
        result = decode_benchmark.run_benchmark(
            "tiny",
            [1],
            CompilationConfig(backend="eager"),
            variants=["eager", "torch.compile"],
            prompt_len=8,
            iterations=1,
            warmups=0,
            progress=False,
            read_probe=lambda nbytes: ReadBandwidth(1e9, nbytes, 1),
        )
    assert [m.variant for m in result.measurements] == ["eager", "torch.compile"]
    assert result.skipped_variants == {}
    assert dynamo_counters["stats"]["unique_graphs"] > graphs  # Dynamo traced the model
    assert dynamo_counters["aot_autograd"]["total"] == aot_compiles  # and Inductor never ran
    assert result.measurements[1].max_abs_logit_diff == 0.0


def test_torch_compile_is_skipped_where_the_default_backend_cannot_target_the_device():
    with use_platform(InductorByDefaultOnMeta()):
        reasons = decode_benchmark.unavailable_variants(decode_benchmark.DEFAULT_VARIANTS)
        with pytest.raises(ValueError) as refused:
            decode_benchmark.variants_for_platform(["eager", "torch.compile"], "tiny")
    assert list(reasons) == ["torch.compile"]
    assert reasons["torch.compile"].startswith(
        "compilation config key 'backend': 'inductor' cannot compile for platform "
        "'ascend_stub': Inductor has no code generator for its device type 'meta'"
    )
    assert str(refused.value) == (
        f"variant 'torch.compile' cannot run here: {reasons['torch.compile']}; drop it from "
        "--variants"
    )


def test_reduce_overhead_is_inductors_and_refused_with_another_default_backend():
    with use_platform(AscendStubPlatform()), pytest.raises(ValueError) as refused:
        decode_benchmark.variants_for_platform(["torch.compile:reduce-overhead"], "tiny")
    assert str(refused.value) == (
        "variant 'torch.compile:reduce-overhead' cannot run here: mode 'reduce-overhead' is "
        "Inductor's, and platform ascend_stub compiles with its default backend 'eager'; "
        "drop it from --variants"
    )
