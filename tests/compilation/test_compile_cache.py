"""The compile cache and its key, the structural graph fingerprint."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from slotwise.compilation.cache import inductor_cache_dir
from slotwise.compilation.cache.cache_key import piece_key
from slotwise.compilation.cache.compile_cache import FACTORS_FILE, CompileCache
from slotwise.compilation.cache.graph_fingerprint import UnfingerprintableGraph
from slotwise.compilation.compile_counters import counters
from slotwise.compilation.compilers import CompiledPiece, EagerCompiler
from slotwise.compilation.config import CompilationConfig

# --- fingerprints ------------------------------------------------------------------------


def layer_3(x, l_layers_modules_3_weight):
    return torch.relu(x @ l_layers_modules_3_weight) + 1.0


def layer_5(hidden, l_layers_modules_5_weight):
    return torch.relu(hidden @ l_layers_modules_5_weight) + 1.0


def key(fn, *inputs, runtime_shape=None):
    return piece_key(torch.fx.symbolic_trace(fn), list(inputs), runtime_shape)


X = torch.randn(4, 8)
W = torch.randn(8, 8)


def test_identical_pieces_with_other_names_share_a_fingerprint():
    assert torch.fx.symbolic_trace(layer_3).code != torch.fx.symbolic_trace(layer_5).code
    assert key(layer_3, X, W) == key(layer_5, X, W)
    assert key(layer_3, X, W) == key(layer_3, torch.randn(4, 8), torch.randn(8, 8))


@pytest.mark.parametrize(
    "other",
    [
        lambda x, w: torch.sigmoid(x @ w) + 1.0,  # op
        lambda x, w: torch.relu(x @ w) - 1.0,  # target
        lambda x, w: torch.relu(w @ x) + 1.0,  # wiring
        lambda x, w: torch.relu(x @ w) + 2.0,  # literal
        lambda x, w: torch.relu(x @ w) + 1,  # literal type
    ],
    ids=["op", "target", "wiring", "literal", "literal-type"],
)
def test_fingerprint_differs_with_the_graph(other):
    assert key(other, X, W) != key(layer_3, X, W)


@pytest.mark.parametrize(
    "inputs",
    [
        (X.double(), W.double()),  # dtype
        (X.reshape(4, 8, 1), W),  # rank
        (torch.randn(5, 8), W),  # static size
        (X.to("meta"), W.to("meta")),  # device
        (torch.randn(8, 4).t(), W),  # strides
    ],
    ids=["dtype", "rank", "size", "device", "strides"],
)
def test_fingerprint_differs_with_the_inputs(inputs):
    assert key(layer_3, *inputs) != key(layer_3, X, W)


def test_fingerprint_differs_with_the_runtime_shape():
    keys = {key(layer_3, X, W, runtime_shape=shape) for shape in (None, 4, 8)}
    assert len(keys) == 3


def symbolic(fn, *inputs):
    graph = make_fx(fn, tracing_mode="symbolic")(*inputs)
    fakes = [node.meta["val"] for node in graph.graph.nodes if node.op == "placeholder"]
    return graph, fakes


def add_sums(x, y):
    return x.sum(0) + y.sum(0)


def test_symbolic_sizes_hash_as_symbols_that_keep_their_sharing():
    # Same structure, other sizes: every size is a symbol, so the key is the same ...
    small = symbolic(add_sums, torch.randn(4, 8), torch.randn(6, 8))
    large = symbolic(add_sums, torch.randn(40, 80), torch.randn(60, 80))
    sizes = [str(size) for size in small[1][0].shape]
    assert not any(size.isdigit() for size in sizes)
    assert piece_key(*small, None) == piece_key(*large, None)
    # ... but inputs sharing a symbol (duck-sized equal dims) are another piece.
    shared = symbolic(add_sums, torch.randn(4, 8), torch.randn(4, 8))
    assert str(shared[1][0].shape[0]) == str(shared[1][1].shape[0])
    assert piece_key(*shared, None) != piece_key(*small, None)


class Scaled(torch.nn.Module):
    def __init__(self, name: str, value: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer(name, value)
        self.name = name

    def forward(self, x):
        return x * getattr(self, self.name)


def test_constant_attributes_hash_by_contents_not_names():
    ones = torch.fx.symbolic_trace(Scaled("scale_a", torch.ones(8)))
    same = torch.fx.symbolic_trace(Scaled("scale_b", torch.ones(8)))
    twos = torch.fx.symbolic_trace(Scaled("scale_a", torch.full((8,), 2.0)))
    assert piece_key(ones, [X], None) == piece_key(same, [X], None)
    assert piece_key(ones, [X], None) != piece_key(twos, [X], None)


def test_unhashable_pieces_are_reported():
    factor = 3.0

    def closure(x):
        return x * factor

    graph = torch.fx.symbolic_trace(lambda x: torch.relu(x))
    with graph.graph.inserting_before(graph.graph.output_node()):
        call = graph.graph.call_function(closure, (next(iter(graph.graph.nodes)),))
    graph.graph.output_node().args = (call,)
    graph.recompile()
    with pytest.raises(UnfingerprintableGraph, match="closure"):
        piece_key(graph, [X], None)
    leaf = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    with pytest.raises(UnfingerprintableGraph, match="call_module"):
        piece_key(leaf, [X], None)


def dynamo_capture(module: torch.nn.Module, x: torch.Tensor):
    captured = []

    def backend(graph, example_inputs):
        captured.append((graph, list(example_inputs)))
        return graph.forward

    torch._dynamo.mark_dynamic(x, 0)
    torch.compile(module, backend=backend, dynamic=False, fullgraph=True)(x)
    (capture,) = captured
    return capture


class First(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.first(x)).view(x.shape[0], 2, 4)


class Second(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.second = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.second(x)).view(x.shape[0], 2, 4)


def test_dynamo_graphs_of_differently_named_layers_share_a_fingerprint():
    graph_a, inputs_a = dynamo_capture(First(), torch.randn(3, 8))
    graph_b, inputs_b = dynamo_capture(Second(), torch.randn(5, 8))
    names_a = [node.name for node in graph_a.graph.nodes if node.op == "placeholder"]
    names_b = [node.name for node in graph_b.graph.nodes if node.op == "placeholder"]
    assert names_a != names_b
    assert any(isinstance(value, torch.SymInt) for value in inputs_a)
    assert piece_key(graph_a, inputs_a, None) == piece_key(graph_b, inputs_b, None)


# --- the cache ---------------------------------------------------------------------------


class PicklingCompiler(EagerCompiler):
    """Eager, plus persistence through pickled graphs: the cache's disk paths, without
    paying for Inductor."""

    name = "pickling"
    supports_persistence = True
    loads = 0

    def compile(self, graph, example_inputs, *, runtime_shape):
        piece = super().compile(graph, example_inputs, runtime_shape=runtime_shape)
        return CompiledPiece(
            fn=piece.fn, save=lambda path: Path(path).write_bytes(pickle.dumps(graph))
        )

    def load(self, path, graph, example_inputs, *, runtime_shape):
        type(self).loads += 1
        return pickle.loads(Path(path).read_bytes()).forward


def make_cache(tmp_path, compiler_cls=PicklingCompiler, factors=None, **config):
    cfg = CompilationConfig(cache_dir=str(tmp_path / "cache"), **config)
    return CompileCache(cfg, compiler_cls(cfg), factors=factors or {"model": "toy"})


def slotwise_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name.startswith("slotwise.")]


def entries(cache: CompileCache) -> list[Path]:
    return sorted(Path(cache.directory).glob("*.bin"))


def run_layer(fn, graph_fn=layer_3):
    torch.testing.assert_close(fn(X, W), graph_fn(X, W))


def test_eager_compiles_count_and_touch_no_disk(tmp_path):
    cache = make_cache(tmp_path, EagerCompiler)
    with counters.expect(
        num_backend_compilations=1, num_eager_compiles=1, num_cache_misses=1, num_cache_hits=0
    ):
        fn = cache.compile(torch.fx.symbolic_trace(layer_3), [X, W], runtime_shape=None)
    run_layer(fn)
    assert not (tmp_path / "cache").exists()


def test_identical_pieces_compile_once_in_memory(tmp_path):
    cache = make_cache(tmp_path, EagerCompiler)
    with counters.expect(
        num_backend_compilations=3, num_eager_compiles=1, num_cache_misses=1, num_cache_hits=2
    ):
        fns = [
            cache.compile(torch.fx.symbolic_trace(fn), [X, W], runtime_shape=None)
            for fn in (layer_3, layer_5, layer_3)
        ]
    for fn in fns:
        run_layer(fn)
    with counters.expect(num_eager_compiles=1, num_cache_misses=1, num_cache_hits=0):
        cache.compile(torch.fx.symbolic_trace(layer_3), [X, W], runtime_shape=4)


def test_a_second_cache_loads_what_the_first_saved(tmp_path):
    graph = torch.fx.symbolic_trace(layer_3)
    first = make_cache(tmp_path)
    with counters.expect(num_eager_compiles=1, num_cache_misses=1, num_cache_hits=0):
        run_layer(first.compile(graph, [X, W], runtime_shape=None))
    (entry,) = entries(first)
    factors = json.loads((Path(first.directory) / FACTORS_FILE).read_text())
    assert factors["traced_code"] == {"model": "toy"}
    assert factors["versions"]["torch"] == torch.__version__
    assert factors["compiler"]["class"].endswith("PicklingCompiler")
    assert set(factors) == {"versions", "config", "traced_code", "compiler", "device"}
    assert not list(Path(first.directory).glob("*.tmp"))

    second = make_cache(tmp_path)
    assert second.directory == first.directory
    loads = PicklingCompiler.loads
    with counters.expect(
        num_backend_compilations=1, num_eager_compiles=0, num_cache_misses=0, num_cache_hits=1
    ):
        run_layer(second.compile(torch.fx.symbolic_trace(layer_5), [X, W], runtime_shape=None))
    assert PicklingCompiler.loads == loads + 1
    assert entries(second) == [entry]


def test_caches_with_other_factors_share_nothing(tmp_path):
    graph = torch.fx.symbolic_trace(layer_3)
    model_a = make_cache(tmp_path, factors={"model": "a"})
    model_b = make_cache(tmp_path, factors={"model": "b"})
    assert model_a.directory != model_b.directory
    with counters.expect(num_eager_compiles=2, num_cache_misses=2, num_cache_hits=0):
        model_a.compile(graph, [X, W], runtime_shape=None)
        model_b.compile(graph, [X, W], runtime_shape=None)
    assert len(entries(model_a)) == len(entries(model_b)) == 1
    other_config = make_cache(tmp_path, factors={"model": "a"}, compile_sizes=[4])
    assert other_config.directory != model_a.directory


def test_a_callers_factor_cannot_stand_in_for_the_caches_own(tmp_path):
    cache = make_cache(tmp_path, factors={"torch": "1.0"})
    assert cache.factors["versions"]["torch"] == torch.__version__
    assert cache.directory != make_cache(tmp_path, factors={"torch": "2.0"}).directory


@pytest.mark.parametrize("how", ["config", "environment"])
def test_a_disabled_cache_writes_nothing_but_still_dedups(tmp_path, monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", "1")
        cache = make_cache(tmp_path)
    else:
        cache = make_cache(tmp_path, disable_cache=True)
    with counters.expect(num_eager_compiles=1, num_cache_misses=1, num_cache_hits=1):
        for fn in (layer_3, layer_5):
            run_layer(cache.compile(torch.fx.symbolic_trace(fn), [X, W], runtime_shape=None))
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: b"\x00garbage" * 100,
        lambda data: data[:-1] + bytes([data[-1] ^ 1]),
        lambda data: b"",
    ],
    ids=["truncated", "garbage", "one-bit", "empty"],
)
def test_a_damaged_entry_warns_recompiles_and_is_overwritten(tmp_path, caplog, damage):
    graph = torch.fx.symbolic_trace(layer_3)
    make_cache(tmp_path).compile(graph, [X, W], runtime_shape=None)
    cache = make_cache(tmp_path)
    (entry,) = entries(cache)
    good = entry.read_bytes()
    entry.write_bytes(damage(good))
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        with counters.expect(num_eager_compiles=1, num_cache_misses=1, num_cache_hits=0):
            run_layer(cache.compile(graph, [X, W], runtime_shape=None))
    (warning,) = slotwise_records(caplog)
    assert str(entry) in warning.getMessage()
    assert "recompiling" in warning.getMessage()
    assert entry.read_bytes() == good


class FailingLoadCompiler(PicklingCompiler):
    def load(self, path, graph, example_inputs, *, runtime_shape):
        raise RuntimeError("incompatible artifact")


def test_an_entry_the_compiler_cannot_load_is_recompiled(tmp_path, caplog):
    graph = torch.fx.symbolic_trace(layer_3)
    make_cache(tmp_path, FailingLoadCompiler).compile(graph, [X, W], runtime_shape=None)
    cache = make_cache(tmp_path, FailingLoadCompiler)
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        with counters.expect(num_eager_compiles=1, num_cache_misses=1, num_cache_hits=0):
            run_layer(cache.compile(graph, [X, W], runtime_shape=None))
    (warning,) = slotwise_records(caplog)
    assert "RuntimeError: incompatible artifact" in warning.getMessage()
    assert str(entries(cache)[0]) in warning.getMessage()


def test_an_unwritable_cache_warns_once_and_runs_in_memory(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cfg = CompilationConfig(cache_dir=str(blocker / "cache"))
    cache = CompileCache(cfg, PicklingCompiler(cfg), factors={"model": "toy"})
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        with counters.expect(num_eager_compiles=2, num_cache_misses=2, num_cache_hits=1):
            for fn in (layer_3, layer_5):
                run_layer(cache.compile(torch.fx.symbolic_trace(fn), [X, W], runtime_shape=None))
            cache.compile(torch.fx.symbolic_trace(layer_3), [X, W], runtime_shape=4)
    (warning,) = slotwise_records(caplog)
    assert "running uncached" in warning.getMessage()
    assert str(blocker) in warning.getMessage()


# --- whose cache it is ------------------------------------------------------------------


def saved_cache(tmp_path) -> CompileCache:
    """A cache holding one entry for layer_3, written by the current user."""
    make_cache(tmp_path).compile(torch.fx.symbolic_trace(layer_3), [X, W], runtime_shape=None)
    return make_cache(tmp_path)


def mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_folders_and_entries_slotwise_creates_are_private(tmp_path):
    cache = saved_cache(tmp_path)
    assert mode(tmp_path / "cache") == mode(cache.directory) == 0o700
    (entry,) = entries(cache)
    assert mode(entry) & 0o077 == 0
    assert mode(Path(cache.directory) / FACTORS_FILE) & 0o077 == 0


def compile_refused(cache: CompileCache, caplog) -> str:
    """Compile layer_3 through ``cache``; assert nothing was loaded; the warning's text."""
    loads = PicklingCompiler.loads
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        with counters.expect(num_eager_compiles=1, num_cache_misses=1, num_cache_hits=0):
            run_layer(cache.compile(torch.fx.symbolic_trace(layer_3), [X, W], runtime_shape=None))
    assert PicklingCompiler.loads == loads
    (warning,) = slotwise_records(caplog)
    return warning.getMessage()


@pytest.mark.parametrize("folder", ["root", "entry folder"])
def test_a_cache_folder_writable_by_others_is_neither_read_nor_written(tmp_path, caplog, folder):
    cache = saved_cache(tmp_path)
    shared = tmp_path / "cache" if folder == "root" else Path(cache.directory)
    shared.chmod(0o777)
    (entry,) = entries(cache)
    before = entry.stat().st_mtime_ns
    message = compile_refused(cache, caplog)
    assert f"{shared} is writable by group or others (mode 777)" in message
    assert "chmod 700" in message
    assert entry.stat().st_mtime_ns == before  # not overwritten either


def test_an_entry_writable_by_others_is_not_loaded(tmp_path, caplog):
    cache = saved_cache(tmp_path)
    (entry,) = entries(cache)
    entry.chmod(0o666)
    message = compile_refused(cache, caplog)
    assert f"not trusted: {entry} is writable by group or others" in message


def test_a_linked_entry_is_not_loaded(tmp_path, caplog):
    cache = saved_cache(tmp_path)
    (entry,) = entries(cache)
    planted = tmp_path / "planted.bin"
    entry.rename(planted)
    entry.symlink_to(planted)
    message = compile_refused(cache, caplog)
    assert str(entry) in message


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root")
def test_a_cache_folder_of_another_user_is_not_used(tmp_path, caplog):
    cache = saved_cache(tmp_path)
    os.chown(cache.directory, 4242, 4242)
    message = compile_refused(cache, caplog)
    assert f"{cache.directory} is owned by uid 4242, not by you (uid 0)" in message


class UnsaveableCompiler(PicklingCompiler):
    def compile(self, graph, example_inputs, *, runtime_shape):
        def save(path):
            raise RuntimeError("nothing to save")

        piece = super().compile(graph, example_inputs, runtime_shape=runtime_shape)
        return CompiledPiece(fn=piece.fn, save=save)


def test_a_piece_that_cannot_be_saved_still_runs(tmp_path, caplog):
    cache = make_cache(tmp_path, UnsaveableCompiler)
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        run_layer(cache.compile(torch.fx.symbolic_trace(layer_3), [X, W], runtime_shape=None))
    (warning,) = slotwise_records(caplog)
    assert "could not be saved" in warning.getMessage()
    assert entries(cache) == []


class FillsTheDiskOnceCompiler(PicklingCompiler):
    """Its first compile ends as Inductor's does when the C++ compiler finds the disk full."""

    def __init__(self, config):
        super().__init__(config)
        self.failures = 1

    def compile(self, graph, example_inputs, *, runtime_shape):
        if self.failures:
            self.failures -= 1
            full = OSError(errno.ENOSPC, "No space left on device")
            raise RuntimeError("InductorError: CppCompileError: C++ compile error") from full
        return super().compile(graph, example_inputs, runtime_shape=runtime_shape)


def test_a_compile_that_fills_the_disk_is_tried_again_off_that_disk(tmp_path, monkeypatch, caplog):
    from torch._inductor import config as inductor_config

    monkeypatch.setattr(inductor_cache_dir, "_placed", None)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "full"))
    cache = make_cache(tmp_path, FillsTheDiskOnceCompiler)
    with inductor_config.patch(cpp_cache_precompile_headers=True):
        with caplog.at_level(logging.WARNING, logger="slotwise"):
            run_layer(cache.compile(torch.fx.symbolic_trace(layer_3), [X, W], runtime_shape=None))
        assert not inductor_config.cpp_cache_precompile_headers  # about 150 MiB, not again
    (warning,) = slotwise_records(caplog)
    assert f"a compile ran out of space in Inductor's cache {tmp_path / 'full'}" in (
        warning.getMessage()
    )
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == inductor_cache_dir._private
    assert len(entries(cache)) == 1  # slotwise's own cache still written where it has room


def test_unhashable_pieces_compile_uncached(tmp_path):
    cache = make_cache(tmp_path)
    leaf = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    with counters.expect(num_eager_compiles=2, num_cache_misses=2, num_cache_hits=0):
        for _ in range(2):
            torch.testing.assert_close(cache.compile(leaf, [X], runtime_shape=None)(X), leaf(X))
    assert not (tmp_path / "cache").exists()


# --- Inductor across processes -----------------------------------------------------------

PROCESS = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from slotwise.compilation.cache.compile_cache import CompileCache
    from slotwise.compilation.compile_counters import counters
    from slotwise.compilation.compilers import make_compiler
    from slotwise.compilation.config import CompilationConfig

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 16)

        def forward(self, x):
            return self.proj(x).relu().view(x.shape[0], 4, 4).sum(-1) * 2

    config = CompilationConfig(backend="inductor", cache_dir=sys.argv[1])
    cache = CompileCache(config, make_compiler("inductor", config), factors={"model": "Layer"})

    def backend(graph, example_inputs):
        general = cache.compile(graph, example_inputs, runtime_shape=None)
        specialised = {}

        def run(*args):
            size = args[-1].shape[0]
            if size != 4:
                return general(*args)
            if size not in specialised:  # lazily, with the real runtime tensors
                specialised[size] = cache.compile(graph, list(args), runtime_shape=size)
            return specialised[size](*args)

        return run

    torch.manual_seed(0)
    model = Layer()
    compiled = torch.compile(model, backend=backend, dynamic=False, fullgraph=True)
    outputs, errors = {}, []
    for size in (3, 4, 9, 2):
        x = torch.randn(size, 8)
        torch._dynamo.mark_dynamic(x, 0)
        out = compiled(x)
        errors.append((out - model(x)).abs().max().item())
        outputs[size] = out.tolist()
    print(json.dumps({"counters": counters.snapshot(), "errors": errors, "outputs": outputs}))
    """
)


def run_process(cache_dir: Path, inductor_dir: Path) -> tuple[dict, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    # Kernels Inductor builds land here in both runs, as on one machine; the cold run
    # starts without any, so it really compiles.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", PROCESS, str(cache_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), seconds


@pytest.mark.slow
def test_inductor_pieces_load_in_a_new_process(tmp_path):
    cache_dir, inductor_dir = tmp_path / "cache", tmp_path / "inductor"
    cold, cold_seconds = run_process(cache_dir, inductor_dir)
    warm, warm_seconds = run_process(cache_dir, inductor_dir)
    print(f"cold {cold_seconds:.1f}s, warm {warm_seconds:.1f}s, {cold_seconds / warm_seconds:.1f}x")

    assert cold["counters"]["num_inductor_compiles"] == 2  # the general shape and size 4
    assert cold["counters"]["num_cache_misses"] == 2
    assert warm["counters"]["num_inductor_compiles"] == 0
    assert warm["counters"]["num_cache_hits"] == 2
    assert warm["counters"]["num_cache_misses"] == 0
    assert max(cold["errors"] + warm["errors"]) <= 1e-5
    assert warm["outputs"] == cold["outputs"]
    assert len(list(cache_dir.glob("*/*.bin"))) == 2
    assert warm_seconds < cold_seconds


@pytest.mark.slow
def test_a_truncated_inductor_entry_is_recompiled(tmp_path, caplog):
    from slotwise.compilation.compilers import InductorCompiler

    cfg = CompilationConfig(backend="inductor", cache_dir=str(tmp_path))
    graph = make_fx(layer_3)(X, W)
    first = CompileCache(cfg, InductorCompiler(cfg), factors={"model": "toy"})
    first.compile(graph, [X, W], runtime_shape=None)
    (entry,) = entries(first)
    entry.write_bytes(entry.read_bytes()[:-100])
    cache = CompileCache(cfg, InductorCompiler(cfg), factors={"model": "toy"})
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        with counters.expect(num_inductor_compiles=1, num_cache_misses=1, num_cache_hits=0):
            fn = cache.compile(graph, [X, W], runtime_shape=None)
    (warning,) = slotwise_records(caplog)
    assert str(entry) in warning.getMessage()
    for size in (4, 7):
        x = torch.randn(size, 8)
        torch.testing.assert_close(fn(x, W), layer_3(x, W), rtol=1e-5, atol=1e-5)
    with counters.expect(num_inductor_compiles=0, num_cache_hits=1):
        reloaded = CompileCache(cfg, InductorCompiler(cfg), factors={"model": "toy"})
        torch.testing.assert_close(
            reloaded.compile(graph, [X, W], runtime_shape=None)(X, W), layer_3(X, W)
        )


@pytest.mark.parametrize("damage", ["writable by others", "truncated"])
def test_an_unusable_named_entry_is_refused_in_one_warning(tmp_path, caplog, damage):
    make_cache(tmp_path).write_named("dynamo-trace-x", b"payload" * 10)
    cache = make_cache(tmp_path)
    entry = Path(cache.directory) / "dynamo-trace-x.bin"
    assert cache.read_named("dynamo-trace-x") == b"payload" * 10
    if damage == "writable by others":
        entry.chmod(0o666)
    else:
        entry.write_bytes(entry.read_bytes()[:-3])
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        assert cache.read_named("dynamo-trace-x") is None
    (warning,) = slotwise_records(caplog)
    message = warning.getMessage()
    assert str(entry) in message and "rebuilt" in message
    if damage == "writable by others":
        assert f"not trusted: {entry} is writable by group or others" in message
        assert "corrupt" not in message
    else:
        assert "corrupt or truncated" in message
