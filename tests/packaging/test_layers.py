"""The layers of slotwise (docs/design.md): a module imports only from its own layer or
lower ones, function-local imports included (names imported for type hints only, under
``if TYPE_CHECKING:``, are not imports), each top-level package sits in one layer with
no import cycle between packages, the core never imports the engine (the
slotwise-engine distribution's modules, in engine/), and the bundled plugins and the
plugin ``slotwise new-plugin`` writes import the core only through
``slotwise.plugin_api``, for type hints too. Read from the source, so a cycle cannot come
back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from slotwise.cli.new_plugin_command import render

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core" / "slotwise"
ENGINE = ROOT / "engine" / "slotwise_engine"
#: The import packages of the two distributions, slotwise and slotwise-engine.
PACKAGE_ROOTS = (CORE, ENGINE)
PACKAGES = {CORE.name, ENGINE.name}
PLUGINS = sorted((ROOT / "plugins").glob("*/slotwise_*"))

#: Lowest first. A module belongs to the longest prefix listed. The engine's library
#: sits above every library layer of the core and below the command lines, which no
#: library module imports.
LAYERS: list[tuple[str, ...]] = [
    ("slotwise.errors", "slotwise.envs", "slotwise.version", "slotwise.api_versioning",
     "slotwise.import_path", "slotwise.stats", "slotwise.cache_permissions",
     "slotwise.config_error", "slotwise.graph_mode",
     "slotwise.lazy_exports"),
    ("slotwise.plugins",),
    ("slotwise.platforms",),
    ("slotwise.forward_context",),
    ("slotwise.attention", "slotwise.distributed"),
    ("slotwise.compilation",),
    ("slotwise.custom_op", "slotwise.layers"),
    ("slotwise.plugin_api", "slotwise.testing", "slotwise"),
    # the engine's library (engine/slotwise_engine)
    ("slotwise_engine",),
    # the command lines, the core's and the engine's
    ("slotwise.cli", "slotwise_engine.cli", "slotwise.__main__"),
]  # fmt: skip


#: The layers inside ``slotwise.compilation``, lowest first, by subpackage or module:
#: settings and small shared pieces, the compile cache, the compilers, the direct entry,
#: the warm start, static graphs, the splitting into pieces and their backends, the
#: platform's defaults, then the compiled forward and the decorators that attach it.
COMPILATION = "slotwise.compilation"
COMPILATION_LAYERS: list[tuple[str, ...]] = [
    ("config", "compile_counters", "compile_lock", "context", "weight_registrations",
     "traced_inputs", "runtime_size", "compiled_modules", "trace_paths"),
    ("cache",),
    ("compilers",),
    ("direct_entry",),
    ("warm_start",),
    ("static_graphs",),
    ("splitting",),
    ("platform_defaults",),
    ("compiled_forward",),
    ("decorators",),
]  # fmt: skip


def layer_of(module: str, layers: list[tuple[str, ...]] = LAYERS) -> int:
    best = max(
        (
            (len(prefix), index)
            for index, prefixes in enumerate(layers)
            for prefix in prefixes
            if module == prefix or module.startswith(prefix + ".")
        ),
        default=None,
    )
    assert best is not None, f"{module} is in no layer; add it to the layers and docs/design.md"
    return best[1]


def compilation_unit(module: str) -> str | None:
    """The subpackage or module of ``slotwise.compilation`` that ``module`` is in
    (``cache`` for ``slotwise.compilation.cache.cache_key``); None outside it and for the
    package's own ``__init__``, which re-exports and sits above all of them."""
    prefix = COMPILATION + "."
    return module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None


def module_name(path: Path) -> str:
    root = next(root for root in PACKAGE_ROOTS if path.is_relative_to(root))
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def imported_modules(path: Path, *, type_hints: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every slotwise import in ``path``, wherever it sits; those under
    ``if TYPE_CHECKING:`` too with ``type_hints``."""
    return imported_from_source(path.read_text(encoding="utf-8"), type_hints=type_hints)


def imported_from_source(source: str, *, type_hints: bool = False) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree) if type_hints else _runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                # "from slotwise.x import y" imports the module x.y when there is one.
                submodule = f"{node.module}.{alias.name}"
                found.append((node.lineno, submodule if _is_module(submodule) else node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name.split(".")[0] in PACKAGES]


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:``: names for type hints only,
    never imported at run time, so they cannot form an import cycle."""
    nodes, pending = [], [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            pending.extend(node.orelse)
            continue
        nodes.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return nodes


def _is_module(name: str, roots: tuple[Path, ...] = PACKAGE_ROOTS) -> bool:
    for root in roots:
        path = root.parent.joinpath(*name.split("."))
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return True
    return False


def _engine_module(name: str) -> bool:
    """Whether ``name`` is, or is inside, the engine distribution's package."""
    return name.split(".")[0] == ENGINE.name


def test_every_module_imports_only_its_layer_and_below():
    violations = []
    for path in [*source_files(CORE), *source_files(ENGINE)]:
        module = module_name(path)
        own = layer_of(module)
        for line, imported in imported_modules(path):
            if layer_of(imported) > own:
                violations.append(
                    f"{path.relative_to(ROOT)}:{line}: {module} (layer {own}) imports "
                    f"{imported} (layer {layer_of(imported)})"
                )
    assert not violations, "imports against the layers:\n" + "\n".join(violations)


def compilation_violations(files: dict[str, list[tuple[int, str]]]) -> list[str]:
    """``module:line: ...`` for each import inside ``slotwise.compilation`` from a lower
    layer of ``COMPILATION_LAYERS`` into a higher one; ``files``: module -> its imports."""
    violations = []
    for module, imports in sorted(files.items()):
        unit = compilation_unit(module)
        if unit is None:
            continue
        own = layer_of(unit, COMPILATION_LAYERS)
        for line, imported in imports:
            target = compilation_unit(imported)
            if target is not None and target != unit:
                if layer_of(target, COMPILATION_LAYERS) > own:
                    violations.append(f"{module}:{line}: {unit} imports {target}")
    return violations


def compilation_imports() -> dict[str, list[tuple[int, str]]]:
    return {
        module_name(path): imported_modules(path) for path in source_files(CORE / "compilation")
    }


def test_compilation_subpackages_import_only_their_layer_and_below():
    violations = compilation_violations(compilation_imports())
    assert not violations, "imports against compilation's layers:\n" + "\n".join(violations)


def test_the_compilation_layer_check_sees_an_import_back_up():
    # A low subpackage importing a higher one, as the compile cache once imported the
    # compilers, must be reported, with the place it happens.
    files = compilation_imports()
    files["slotwise.compilation.cache.compile_cache"] = [
        *files["slotwise.compilation.cache.compile_cache"],
        (1, "slotwise.compilation.compilers"),
    ]
    assert compilation_violations(files) == [
        "slotwise.compilation.cache.compile_cache:1: cache imports compilers"
    ]


def test_every_compilation_unit_sits_in_one_layer():
    units = {compilation_unit(module) for module in compilation_imports()} - {None}
    for unit in units:
        layer_of(unit, COMPILATION_LAYERS)  # fails naming a unit that is in no layer


def top_level_package(module: str) -> str:
    """``slotwise.compilation`` for ``slotwise.compilation.cache.compile_cache``."""
    return ".".join(module.split(".")[:2])


def test_every_top_level_package_sits_in_one_layer():
    layers: dict[str, set[int]] = {}
    for path in [*source_files(CORE), *source_files(ENGINE)]:
        module = module_name(path)
        layers.setdefault(top_level_package(module), set()).add(layer_of(module))
    split = {package: sorted(found) for package, found in layers.items() if len(found) > 1}
    assert not split, f"packages spread over several layers (package: layers): {split}"


def test_no_import_cycle_between_top_level_packages():
    edges: dict[str, set[str]] = {}
    for path in [*source_files(CORE), *source_files(ENGINE)]:
        package = top_level_package(module_name(path))
        imported = {top_level_package(name) for _, name in imported_modules(path)}
        edges.setdefault(package, set()).update(imported - {package})
    cycles = sorted({" -> ".join(cycle) for cycle in _cycles(edges)})
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def test_no_import_cycle_between_modules():
    # Within a layer too (models/hf_config.py and models/llama.py, say): a module
    # imported by one it imports, function-local imports included.
    edges: dict[str, set[str]] = {}
    for path in [*source_files(CORE), *source_files(ENGINE)]:
        module = module_name(path)
        edges.setdefault(module, set()).update(
            name for _, name in imported_modules(path) if name != module
        )
    cycles = sorted({" -> ".join(cycle) for cycle in _cycles(edges)})
    assert not cycles, "import cycles between modules:\n" + "\n".join(cycles)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """A cycle back to each node (package or module) that is the smallest name on one (a
    search from it through larger names only, so each cycle is reported from one node)."""
    found = []
    for start in sorted(edges):
        pending, seen = [(start, [start])], {start}
        while pending:
            node, trail = pending.pop()
            for target in sorted(edges.get(node, ())):
                if target == start:
                    found.append([*trail, start])
                elif target > start and target not in seen:
                    seen.add(target)
                    pending.append((target, [*trail, target]))
    return found


def test_the_core_imports_no_module_of_the_engine():
    # What `pip install slotwise` alone must run without: the engine is another
    # distribution, and its modules join the package only when it is installed.
    violations = [
        f"{path.relative_to(ROOT)}:{line}: {module_name(path)} imports {imported}"
        for path in source_files(CORE)
        for line, imported in imported_modules(path)
        if _engine_module(imported)
    ]
    assert not violations, "the core imports the engine:\n" + "\n".join(violations)


def test_each_distribution_is_one_import_package_of_its_own():
    import slotwise
    import slotwise_engine

    # No shared namespace: one folder each, and no other distribution adds to slotwise.
    assert [Path(path) for path in slotwise.__path__] == [CORE]
    assert [Path(path) for path in slotwise_engine.__path__] == [ENGINE]
    assert not (ROOT / "engine" / "slotwise").exists()


def test_the_runner_modules_do_not_import_each_other():
    runner = ENGINE / "runner"
    imports = {
        module_name(path): {name for _, name in imported_modules(path)}
        for path in source_files(runner)
    }
    cycles = sorted(
        (a, b) for a, names in imports.items() for b in names if a in imports.get(b, ()) and a < b
    )
    assert not cycles, f"runner modules importing each other: {cycles}"


def plugin_api_violations(files: dict[str, str]) -> list[str]:
    """``path:line: imports module`` for each import of slotwise from outside
    ``slotwise.plugin_api`` in ``files`` (path -> source), type hints included: a plugin
    that names anything else breaks when the core moves it."""
    return [
        f"{path}:{line}: imports {imported}"
        for path, source in sorted(files.items())
        for line, imported in imported_from_source(source, type_hints=True)
        if imported != "slotwise.plugin_api"
    ]


@pytest.mark.parametrize("package", PLUGINS, ids=lambda path: path.name)
def test_bundled_plugins_import_the_core_only_through_the_plugin_api(package):
    files = {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in package.rglob("*.py")
    }
    violations = plugin_api_violations(files)
    assert not violations, "use `from slotwise.plugin_api import ...`:\n" + "\n".join(violations)


@pytest.mark.parametrize("graphs", [False, True], ids=["no_graphs", "graphs"])
def test_a_new_plugin_imports_the_core_only_through_the_plugin_api(graphs):
    files = {path: text for path, text in render("acme", graphs).items() if path.endswith(".py")}
    package = {path: text for path, text in files.items() if path.startswith("slotwise_acme/")}
    assert "slotwise_acme/plugin.py" in package
    violations = plugin_api_violations(package)
    assert not violations, "use `from slotwise.plugin_api import ...`:\n" + "\n".join(violations)
