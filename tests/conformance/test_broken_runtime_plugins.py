"""Plugins that pass a look at their class but break when slotwise calls them fail the run.

Each is a throwaway distribution whose platform is the CPU's under another name, broken
where a vendor's first device plugin broke: a ``default_compile_backend`` that cannot
compile for the device, a ``synchronize`` that raises, a device generator that ignores
its seed, a ``synchronize`` that ends the process or never returns (in Python, in
native code, in native code holding the GIL), and a plugin that leaves a process behind
holding pytest's output open.  And a correct plugin on a device that lacks ops slotwise
never runs on it passes: the kit checks results on host copies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conformance_runs import TIMEOUT_S, environment, messages, outcomes, run_cli
from support import Distributions

pytestmark = pytest.mark.slow

#: The CPU platform as "NAME", with its CPU attention backend; PLATFORM_BODY is replaced
#: by what each plugin changes in the platform class.
PLUGIN = """
    from slotwise.plugin_api import PlatformSpec, hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class BrokenPlatform(CpuPlatform):
        name = "NAME"
    PLATFORM_BODY

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("NAME", "MODULE:BrokenPlatform", lambda: True, priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register_own("slotwise_cpu.attention:CpuSdpaBackend")
"""


def add_plugin(dists: Distributions, name: str, platform_body: str) -> None:
    module = f"slotwise_{name}"
    source = textwrap.dedent(PLUGIN).replace("NAME", name).replace("MODULE", module)
    body = textwrap.indent(textwrap.dedent(platform_body).strip("\n"), "    ")
    dists.add(module.replace("_", "-"), source.replace("PLATFORM_BODY", body))


#: pytest -k for the tests of the device check, not the interface's test_device_* ones.
DEVICE_CHECK = "(device and not interface)"


def failed_tests(summary: dict, check: str) -> dict[str, str]:
    tests = next(c["tests"] for c in summary["checks"] if c["check"] == check)
    return {t["name"]: t["message"] for t in tests if t["outcome"] == "failed"}


#: A compiler for the CPU that, like Inductor on a device it has no code generator
#: for, raises on the first piece it is given.
NO_CODEGEN_COMPILER = """
    from slotwise.compilation.compilers import Compiler

    class NoCodegenCompiler(Compiler):
        name = "no_codegen"

        def compile(self, graph, example_inputs, *, runtime_shape):
            raise RuntimeError("no code generator for this device")
"""

#: Three findings in one platform, each caught by a check of its own.
BROKEN_AT_RUN_TIME = """
    default_compile_backend = "no_codegen_compiler:NoCodegenCompiler"

    def __init__(self):
        super().__init__()
        # A device runtime whose generators draw the same whatever the seed, standing in
        # for a PrivateUse1 generator that ignores manual_seed.
        import torch

        class SeedIgnoringGenerator(torch.Generator):
            def manual_seed(self, seed):
                return super().manual_seed(7)

        torch.Generator = SeedIgnoringGenerator

    def synchronize(self, **kwargs):
        raise RuntimeError("device lost: the command queue stalled")
"""


@pytest.fixture(scope="module")
def broken_at_run_time(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run of the checks concerned on the platform broken three ways."""
    dists = Distributions(tmp_path_factory.mktemp("site"))
    (dists.root / "no_codegen_compiler.py").write_text(textwrap.dedent(NO_CODEGEN_COMPILER))
    add_plugin(dists, "run_time", BROKEN_AT_RUN_TIME)
    summary, result = run_cli(
        "run_time", "-k", f"interface or {DEVICE_CHECK} or test_level3", site=dists.root
    )
    assert result.returncode == 1, result.stderr[-5000:]
    return summary


def test_a_default_compiler_that_cannot_compile_fails_the_compile_check(broken_at_run_time):
    summary = broken_at_run_time
    # Its name is a valid compile backend: the interface check cannot tell.
    assert outcomes(summary)["interface"] == "passed", messages(summary, "interface")
    failed = failed_tests(summary, "compile")
    backend = (
        "compile backend 'no_codegen_compiler:NoCodegenCompiler', the platform's "
        "default_compile_backend"
    )
    whats = {
        "test_level3_splits_into_five_pieces_three_capturable": f"2 splitting ops, {backend}",
        "test_level3_matches_eager_for_every_size_without_tracing_again": backend,
    }
    assert set(failed) == set(whats), summary
    for name, what in whats.items():
        message = failed[name]
        assert message.startswith(
            f"platform 'run_time': SillyModel at level 3 ({what}) does not compile and run "
            "on the device: "
        ), message
        assert "no code generator for this device" in message, message
        assert "set default_compile_backend to a compiler that targets the device" in message


def test_a_synchronize_that_raises_fails_the_device_check(broken_at_run_time):
    message = failed_tests(broken_at_run_time, "device")[
        "test_synchronize_returns_after_queued_work"
    ]
    assert message.startswith(
        "platform 'run_time': synchronize() raised RuntimeError: device lost: the command "
        "queue stalled; slotwise calls it after queuing work"
    ), message


def test_a_generator_that_ignores_the_seed_fails_the_device_check(broken_at_run_time):
    failed = failed_tests(broken_at_run_time, "device")
    for draw in ("exponential_", "rand"):
        message = failed[f"test_a_seeded_device_generator_repeats_its_draws[{draw}]"]
        assert message == (
            f"platform 'run_time': {draw}(generator=torch.Generator('cpu')) drew the same "
            "values after manual_seed(1234) and manual_seed(4321): the generator ignores "
            "the seed"
        )
    assert "test_set_device_accepts_the_visible_devices" not in failed


def test_a_synchronize_that_ends_the_process_fails_naming_it(dists):
    add_plugin(
        dists,
        "exiting_sync",
        """
        def synchronize(self, **kwargs):
            import os

            os._exit(3)
        """,
    )
    summary, result = run_cli("exiting_sync", "-k", DEVICE_CHECK, site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    assert summary["exit_status"] == 3
    failed = failed_tests(summary, "device")
    assert list(failed) == ["test_synchronize_returns_after_queued_work"], summary
    message = failed["test_synchronize_returns_after_queued_work"]
    assert message.startswith(
        "platform 'exiting_sync': the test process ended (exit status 3) during device :: "
        "test_synchronize_returns_after_queued_work, while calling synchronize(), without "
        "a Python exception"
    ), message
    # The test before it passed; the two after it never ran, and the verdict says so.
    assert summary["stopped"]["tests_not_run"] == 2
    assert summary["verdict"] == (
        "FAILED: device; the suite stopped at device :: "
        "test_synchronize_returns_after_queued_work and 2 more tests did not run (rerun "
        "with `-- --deselect test_device.py::test_synchronize_returns_after_queued_work` "
        "to check them)"
    )


#: Hangs of synchronize: in Python, in native code that released the GIL (as a kernel
#: launched through torch does), and in native code holding it.  ``ctypes`` locks a
#: default pthread mutex twice: a wait that no signal ends.
HANGS = {
    "python": """
        def synchronize(self, **kwargs):
            import time

            while True:
                time.sleep(0.05)
        """,
    "native": """
        def synchronize(self, **kwargs):
            import ctypes

            libc = ctypes.CDLL(None)
            mutex = ctypes.create_string_buffer(64)
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)
        """,
}
HANGS["native_holding_the_gil"] = HANGS["native"].replace("ctypes.CDLL", "ctypes.PyDLL")
#: Generous enough that the tests before and after the hung one never reach it on a loaded
#: machine.
TIME_LIMIT_S = "5"


def test_a_synchronize_hanging_in_python_fails_its_test_and_the_suite_goes_on(dists, tmp_path):
    add_plugin(dists, "hung_sync", HANGS["python"])
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--slotwise-conformance",
            "--slotwise-platform=hung_sync",
            f"--slotwise-timeout={TIME_LIMIT_S}",
            f"--slotwise-conformance-report={report}",
            "-k",
            DEVICE_CHECK,
        ],
        cwd=tmp_path,
        env=environment(dists.root),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 1, result.stdout[-5000:]
    tests = {t["name"]: t for t in json.loads(report.read_text())["tests"]}
    hung = tests.pop("test_synchronize_returns_after_queued_work")
    assert hung["outcome"] == "failed"
    assert hung["message"] == (
        "platform 'hung_sync': device :: test_synchronize_returns_after_queued_work exceeded "
        "5 s while calling synchronize(), the time limit of each test (`slotwise conformance "
        "NAME --timeout S`, `pytest --slotwise-timeout=S`)"
    )
    # Interrupted in Python: the tests after it ran, and passed.
    assert len(tests) == 3
    assert {t["outcome"] for t in tests.values()} == {"passed"}, tests
    # The traceback shows where it hung.
    assert "time.sleep(0.05)" in result.stdout


#: Which stage of the time limit ends each native hang (time_limit's docstring).
ENDED_BY = {
    "native": "stuck in native code (a kernel or a driver call that never finishes): the "
    "watchdog ended the test process",
    "native_holding_the_gil": "stuck in native code that holds the GIL, so the time limit's "
    "last resort (faulthandler) ended the test process",
}


@pytest.mark.parametrize("hang", list(ENDED_BY))
def test_a_synchronize_hanging_in_native_code_ends_the_run_naming_it(dists, hang):
    add_plugin(dists, "hung_sync", HANGS[hang])
    summary, result = run_cli(
        "hung_sync", "-k", DEVICE_CHECK, site=dists.root, time_limit=TIME_LIMIT_S
    )
    assert result.returncode == 1, result.stderr[-5000:]
    failed = failed_tests(summary, "device")
    assert list(failed) == ["test_synchronize_returns_after_queued_work"], summary
    message = failed["test_synchronize_returns_after_queued_work"]
    assert message.startswith(
        "platform 'hung_sync': device :: test_synchronize_returns_after_queued_work exceeded "
        "5 s while calling synchronize(), the time limit of each test"
    ), message
    assert ENDED_BY[hang] in message, message
    assert summary["stopped"]["tests_not_run"] == 2
    # Either stage dumps every thread's traceback, the hung call's included.
    assert "in synchronize" in result.stderr, result.stderr[-5000:]


#: Started with the platform, in pytest's process: a helper that inherits its stdout
#: and outlives it, as a device daemon or a compile server may.
LINGERING_HELPER = """
    def __init__(self):
        super().__init__()
        import os
        import subprocess
        import sys

        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.environ["HELPER_PID_FILE"], "w") as pid_file:
            pid_file.write(str(helper.pid))
"""


def test_a_helper_process_holding_the_output_does_not_keep_the_command_waiting(dists, tmp_path):
    add_plugin(dists, "helper", LINGERING_HELPER)
    pid_file = tmp_path / "helper.pid"
    try:
        summary, result = run_cli(
            "helper", "-k", "interface", site=dists.root, HELPER_PID_FILE=str(pid_file)
        )
        assert result.returncode == 0, result.stderr[-5000:]
        assert outcomes(summary) == {"interface": "passed"}
        # The command returned while the helper still holds pytest's output open.
        os.kill(int(pid_file.read_text()), 0)
    finally:
        if pid_file.exists():
            _end(int(pid_file.read_text()))


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


#: A device that, as PyTorch's openreg example device, implements ``abs`` (and so
#: ``isfinite``, ``isclose``, ``allclose``) for float32 only.  The tensors the plugin's
#: kernels write are its "device memory"; every op on them gives device tensors, except
#: ``.cpu()``/``.to("cpu")``, which copy to the host, as on a real device.
ABS_FOR_FLOAT32_ONLY = """
    import weakref

    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils import _pytree as pytree

    from slotwise_cpu.attention import CpuSdpaBackend, CpuSdpaImpl

    ABS_FAMILY = {"abs", "absolute", "__abs__", "isfinite", "isinf", "isclose", "allclose"}
    _device_tensors = weakref.WeakValueDictionary()


    def _root(tensor):
        return tensor if tensor._base is None else tensor._base


    def on_device(value):
        if not isinstance(value, torch.Tensor):
            return False
        return _device_tensors.get(id(_root(value))) is _root(value)


    def to_device(value):
        for tensor in pytree.tree_leaves(value):
            if isinstance(tensor, torch.Tensor):
                _device_tensors[id(_root(tensor))] = _root(tensor)
        return value


    def _to_host(name, args, kwargs):
        if name == "cpu":
            return True
        targets = [*args[1:], kwargs.get("device")]
        return name == "to" and any(str(t) == "cpu" for t in targets if t is not None)


    class AbsForFloat32Only(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            inputs = [t for t in pytree.tree_leaves((args, kwargs)) if on_device(t)]
            if not inputs or name == "__get__":
                return func(*args, **kwargs)
            if name in ABS_FAMILY and any(t.dtype != torch.float32 for t in inputs):
                dtype = inputs[0].dtype
                raise NotImplementedError(
                    f'"{name}" is implemented for float32 only on this device, got {dtype}'
                )
            out = func(*args, **kwargs)
            if _to_host(name, args, kwargs):
                return out.clone()
            return to_device(out)


    AbsForFloat32Only().__enter__()


    class DeviceImpl(CpuSdpaImpl):
        def forward(self, layer, q, k, v, kv_cache, metadata, output):
            super().forward(layer, q, k, v, kv_cache, metadata, output)
            to_device(output)


    class DeviceBackend(CpuSdpaBackend):
        @classmethod
        def get_name(cls):
            return "ABS_FOR_FLOAT32_ONLY"

        @classmethod
        def get_impl_cls(cls):
            return DeviceImpl


    def rms_norm(layer, x, residual=None):
        return to_device(layer.forward_native(x, residual))
"""

DEVICE_PLUGIN = """
    from slotwise.plugin_api import PlatformSpec, hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class AbsShyPlatform(CpuPlatform):
        name = "abs_shy"

    def rms_norm(layer, x, residual=None):
        from abs_for_float32_only import rms_norm

        return rms_norm(layer, x, residual)

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("abs_shy", "slotwise_abs_shy:AbsShyPlatform", lambda: True,
                             priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register_own("abs_for_float32_only:DeviceBackend")

    @hookimpl
    def slotwise_register_custom_ops(registry):
        registry.register_own("rms_norm", rms_norm)
"""


def test_a_device_lacking_abs_for_half_dtypes_passes_the_kits_checks(dists):
    (dists.root / "abs_for_float32_only.py").write_text(textwrap.dedent(ABS_FOR_FLOAT32_ONLY))
    dists.add("slotwise-abs-shy", DEVICE_PLUGIN)
    selected = "matches_the_reference and decode and not boundaries or matches_forward_native"
    summary, result = run_cli("abs_shy", "-k", selected, site=dists.root)
    assert result.returncode == 0, json.dumps(summary, indent=2)[-5000:]
    attention = next(c for c in summary["checks"] if c["check"] == "attention")
    dtypes = {test["name"].split("-")[1] for test in attention["tests"]}
    assert dtypes == {"float32", "bfloat16", "float16"}, attention
    assert attention["passed"] == len(attention["tests"])
    assert outcomes(summary)["custom_ops"] == "passed"


def test_the_device_stand_in_refuses_abs_for_half_dtypes_only(dists):
    (dists.root / "abs_for_float32_only.py").write_text(textwrap.dedent(ABS_FOR_FLOAT32_ONLY))
    result = dists.run(
        """
        import torch
        from abs_for_float32_only import to_device

        for dtype in (torch.float32, torch.bfloat16):
            on_device = to_device(torch.ones(4, dtype=dtype))[1:]
            assert bool(on_device.cpu().isfinite().all())
            try:
                on_device.isfinite()
            except NotImplementedError as exc:
                print(dtype, "refused:", exc)
            else:
                print(dtype, "ran")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "torch.float32 ran",
        'torch.bfloat16 refused: "isfinite" is implemented for float32 only on this device, '
        "got torch.bfloat16",
    ]
