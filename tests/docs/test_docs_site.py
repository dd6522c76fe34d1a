"""The documentation site's shape: every page in the nav, results pages without a diary,
and plugin examples that import from the plugin API alone.

`make docs` builds the site with `mkdocs build --strict` (broken links and anchors, pages
left out of the nav); these tests hold what that build cannot see.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import slotwise.plugin_api

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
IMPORT = re.compile(r"^\s*(?:>>>\s*)?from\s+(slotwise[\w.]*)\s+import\s+\(?([\w ,]+)", re.M)


def nav_groups() -> dict[str, list[str]]:
    """The pages of each top-level nav group of mkdocs.yml, in order."""
    groups: dict[str, list[str]] = {}
    current = ""
    for line in (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].splitlines():
        group = re.match(r"^  - ([^:]+):\s*$", line)
        page = re.search(r":\s*(\S+\.md)\s*$", line)
        if group:
            current = group[1]
        elif page:
            groups.setdefault(current if line.startswith("      ") else "", []).append(page[1])
        elif line.strip() and not line.startswith(" "):
            break
    return groups


def test_every_docs_page_is_in_the_nav_once():
    pages = [page for group in nav_groups().values() for page in group]
    assert sorted(pages) == sorted(path.name for path in DOCS.glob("*.md"))


def test_the_nav_has_the_three_groups_of_the_site():
    groups = nav_groups()
    assert {"install.md", "generation.md", "configuration.md", "benchmarks.md"} <= set(
        groups["Using slotwise"]
    )
    assert {"plugin-authors.md", "conformance.md", "api-versioning.md", "support-matrix.md"} <= (
        set(groups["Writing a plugin"])
    )
    assert {"design.md", "compilation.md", "attention.md", "distributed.md", "cpu-kernels.md"} <= (
        set(groups["Internals"])
    )


def test_the_api_reference_is_generated_from_the_plugin_api():
    assert re.search(r"^::: slotwise\.plugin_api$", (DOCS / "api.md").read_text(), re.M)


@pytest.mark.parametrize(("page", "limit"), [("benchmarks.md", 400), ("cpu-kernels.md", 300)])
def test_results_pages_are_short_and_hold_no_diary(page, limit):
    text = (DOCS / page).read_text()
    assert len(text.splitlines()) <= limit
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert not [line for line in headings if DATE.search(line)], "dated sections"
    assert not re.search(r"\bsessions?\b|\bthis sitting\b|\btoday\b", text, re.I)


def test_cpu_kernel_page_holds_no_dates():
    """Dates belong to figures, which live on the benchmarks page."""
    assert not DATE.search((DOCS / "cpu-kernels.md").read_text())


def benchmark_sections() -> dict[str, str]:
    text = (DOCS / "benchmarks.md").read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize(
    "section", [name for name in benchmark_sections() if name not in ("Machines", "Summary")]
)
def test_every_benchmark_has_a_command_a_target_or_bound_and_a_gpu_row(section):
    body = benchmark_sections()[section]
    assert "**What it measures.**" in body or "**What they measure.**" in body
    assert "Command" in body
    assert "bounds" in body
    gpu_rows = [line for line in body.splitlines() if line.startswith("| H200")]
    assert gpu_rows, "no row for the GPU machine (figures, or 'not measured')"


def plugin_api_imports_elsewhere(text: str) -> list[str]:
    """Imports in ``text`` that take a plugin-API name from another module."""
    names = set(slotwise.plugin_api.__all__)
    bad = []
    for match in IMPORT.finditer(text):
        imported = {name.strip() for name in match[2].split(",")}
        if match[1] != "slotwise.plugin_api" and imported & names:
            bad.append(match[0].strip())
    return bad


def test_the_readme_plugin_example_imports_from_the_plugin_api():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Writing a plugin", 1)[1].split("\n## ", 1)[0]
    assert "from slotwise.plugin_api import" in section
    assert plugin_api_imports_elsewhere(section) == []


def docstrings() -> list[tuple[str, str]]:
    found = []
    for base in ("core", "plugins"):
        for path in sorted((ROOT / base).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                    text = ast.get_docstring(node, clean=False)
                    if text:
                        found.append(
                            (f"{path.relative_to(ROOT)}:{getattr(node, 'name', '')}", text)
                        )
    return found


def test_docstring_examples_import_plugin_names_from_the_plugin_api():
    bad = [
        (where, line) for where, text in docstrings() for line in plugin_api_imports_elsewhere(text)
    ]
    assert bad == []


def test_the_import_check_sees_a_plugin_name_taken_from_elsewhere():
    assert plugin_api_imports_elsewhere("    from slotwise.platforms import PlatformSpec\n") == [
        "from slotwise.platforms import PlatformSpec"
    ]
    assert plugin_api_imports_elsewhere("from slotwise.plugin_api import PlatformSpec\n") == []
