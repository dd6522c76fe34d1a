"""The core's layers (docs/design.md): a module imports only from its own layer or lower
ones, function-local imports included (names imported for type hints only, under
``if TYPE_CHECKING:``, are not imports), and the bundled plugins import the core only
through ``slotwise.plugin_api``. Read from the source, so a cycle cannot come back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core" / "slotwise"
PLUGINS = sorted((ROOT / "plugins").glob("*/slotwise_*"))

#: Lowest first. A module belongs to the longest prefix listed.
LAYERS: list[tuple[str, ...]] = [
    ("slotwise.errors", "slotwise.envs", "slotwise.version", "slotwise.api_versioning",
     "slotwise.import_path", "slotwise.stats", "slotwise.cache_permissions"),
    ("slotwise.plugins",),
    ("slotwise.platforms",),
    ("slotwise.compilation.config", "slotwise.compilation.context", "slotwise.forward_context"),
    ("slotwise.custom_op",),
    ("slotwise.attention", "slotwise.distributed", "slotwise.layers"),
    ("slotwise.compilation",),
    ("slotwise.models", "slotwise.runner", "slotwise.decode_benchmark"),
    ("slotwise.plugin_api", "slotwise.testing", "slotwise.cli", "slotwise.__main__", "slotwise"),
]  # fmt: skip


def layer_of(module: str) -> int:
    best = max(
        (
            (len(prefix), index)
            for index, prefixes in enumerate(LAYERS)
            for prefix in prefixes
            if module == prefix or module.startswith(prefix + ".")
        ),
        default=None,
    )
    assert best is not None, f"{module} is in no layer; add it to LAYERS and docs/design.md"
    return best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(CORE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every slotwise import in ``path``, wherever it sits."""
    found = []
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                # "from slotwise.x import y" imports the module x.y when there is one.
                submodule = f"{node.module}.{alias.name}"
                found.append((node.lineno, submodule if _is_module(submodule) else node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name.split(".")[0] == "slotwise"]


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


def _is_module(name: str) -> bool:
    path = CORE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_core_module_imports_only_its_layer_and_below():
    violations = []
    for path in sorted(CORE.rglob("*.py")):
        module = module_name(path)
        own = layer_of(module)
        for line, imported in imported_modules(path):
            if layer_of(imported) > own:
                violations.append(
                    f"{path.relative_to(ROOT)}:{line}: {module} (layer {own}) imports "
                    f"{imported} (layer {layer_of(imported)})"
                )
    assert not violations, "imports against the layers:\n" + "\n".join(violations)


@pytest.mark.parametrize("package", PLUGINS, ids=lambda path: path.name)
def test_bundled_plugins_import_the_core_only_through_the_plugin_api(package):
    allowed = {"slotwise.plugin_api"}
    violations = [
        f"{path.relative_to(ROOT)}:{line}: imports {imported}"
        for path in sorted(package.rglob("*.py"))
        for line, imported in imported_modules(path)
        if imported not in allowed
    ]
    assert not violations, "use `from slotwise.plugin_api import ...`:\n" + "\n".join(violations)
