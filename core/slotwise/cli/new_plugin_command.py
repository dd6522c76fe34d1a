"""``slotwise new-plugin NAME``: write a complete, pip-installable plugin for a new platform.

The package passes ``slotwise conformance NAME`` as written (the host CPU stands in for
the device) and marks each place where the device goes with ``TODO(vendor)``.  The
templates in ``plugin_template/`` are rendered strictly: a missing value is an error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import string
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from slotwise import version
from slotwise.errors import SlotwiseError
from slotwise.platforms.resolution import get_resolver
from slotwise.platforms.spec import PLATFORM_NAME_PATTERN
from slotwise.plugins.manager import stdout_to_stderr

logger = logging.getLogger(__name__)

TEMPLATES = resources.files("slotwise.cli") / "plugin_template"

#: Template -> the file it becomes in the plugin folder; {package} is the package folder.
FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "package/__init__.py.tmpl": "{package}/__init__.py",
    "package/plugin.py.tmpl": "{package}/plugin.py",
    "package/platform.py.tmpl": "{package}/platform.py",
    "package/attention.py.tmpl": "{package}/attention.py",
    "package/custom_ops.py.tmpl": "{package}/custom_ops.py",
    "tests/test_conformance.py.tmpl": "tests/test_conformance.py",
    "github/workflows/conformance.yml.tmpl": ".github/workflows/conformance.yml",
}
#: Written with --graphs only.
GRAPH_FILES = {"package/graphs.py.tmpl": "{package}/graphs.py"}
#: Placeholders whose text differs with --graphs: fragments/<placeholder>.{graphs,none}.tmpl.
FRAGMENTS = ("get_graph_api_body", "readme_graphs")
#: Longest platform name: the generated code keeps to 100 columns up to it (a test checks).
MAX_NAME_LENGTH = 24


class NewPluginError(SlotwiseError, ValueError):
    """The plugin cannot be generated as asked (a bad name, an occupied folder)."""


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name,
        help="write a new platform plugin package that passes the conformance suite",
        description="Write a complete, pip-installable plugin package for platform NAME, "
        "running on the host CPU until its TODO(vendor) lines are replaced. It has no static "
        "graphs unless --graphs is given; its pyproject.toml requires the slotwise releases "
        "compatible with this one.",
    )
    parser.add_argument("name", metavar="NAME", help="the platform, as in SLOTWISE_PLATFORM")
    parser.add_argument(
        "--path",
        metavar="DIR",
        type=Path,
        help="where to write it (default ./slotwise-NAME, with hyphens for underscores)",
    )
    parser.add_argument(
        "--graphs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="--graphs also writes graphs.py: static graphs, simulated by RecordedGraphAPI "
        "until your SDK's are wrapped in. Without it (the default) the platform has no static "
        "graphs: get_graph_api() returns None, so the only graph mode is NONE",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    check_name(args.name)
    path = args.path if args.path is not None else Path(distribution(args.name))
    files = render(args.name, graphs=args.graphs)
    write(path, files)
    result = {
        "name": args.name,
        "path": str(path.resolve()),
        "files": sorted(files),
        "graphs": args.graphs,
    }
    print(json.dumps(result, indent=2) if args.json else report(result, path))
    return 0


def check_name(name: str) -> None:
    """Refuse what PlatformSpec would refuse, a name whose device variable would be one of
    slotwise's own (SLOTWISE_*), and a name an installed plugin already has."""
    if not PLATFORM_NAME_PATTERN.match(name):
        raise NewPluginError(
            f"platform name {name!r} must be lower-case letters, digits and underscores, "
            "starting with a letter, as PlatformSpec requires (e.g. 'myvendor')"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise NewPluginError(
            f"platform name {name!r} has {len(name)} characters; new-plugin takes up to "
            f"{MAX_NAME_LENGTH}, so the generated code fits in 100 columns (users type it in "
            "SLOTWISE_PLATFORM too); choose a shorter one (e.g. 'myvendor')"
        )
    if devices_variable(name).startswith("SLOTWISE_"):
        raise NewPluginError(
            f"platform name {name!r} would make its device variable "
            f"{devices_variable(name)}, in slotwise's own SLOTWISE_* namespace; "
            "name the platform after your hardware (e.g. 'myvendor')"
        )
    # Plugin code may print while it loads: keep stdout for the answer.
    with stdout_to_stderr():
        entry = get_resolver().entries.get(name)
    if entry is not None:
        # resolution refuses a second plugin declaring a name already taken.
        raise NewPluginError(
            f"platform {name!r} is already declared by the installed {entry.plugin.label}, "
            "so a second plugin declaring it would fail to load; choose another name"
        )


def devices_variable(name: str) -> str:
    return f"{name.upper()}_DEVICES"


def distribution(name: str) -> str:
    """The distribution's name, hyphenated as pip prints it (slotwise-my-npu)."""
    return f"slotwise-{name.replace('_', '-')}"


def placeholders(name: str, graphs: bool) -> dict[str, str]:
    """What the templates' $placeholders stand for, for platform ``name``."""
    title = "".join(part.capitalize() for part in name.split("_"))
    major = int(version.API_VERSION.split(".")[0])
    values = {
        "name": name,
        "title": title,
        "package": f"slotwise_{name}",
        "distribution": distribution(name),
        "devices_var": devices_variable(name),
        "backend_name": f"{name.upper()}_REFERENCE",
        "slotwise_version": version.__version__,
        "api_version": version.API_VERSION,
        "requires_api": f">={version.API_VERSION},<{major + 1}",
        "requires_slotwise": compatible_releases(version.__version__),
    }
    variant = "graphs" if graphs else "none"
    for fragment in FRAGMENTS:
        text = (TEMPLATES / "fragments" / f"{fragment}.{variant}.tmpl").read_text("utf-8")
        values[fragment] = string.Template(text.rstrip("\n")).substitute(values)
    return values


def compatible_releases(release: str) -> str:
    """The pip specifier of the slotwise releases a plugin generated by ``release`` works
    with: up to the next minor version while slotwise is 0.x (where a minor release may
    break plugins), up to the next major version from 1.0 on."""
    major, minor = (int(part) for part in release.split(".")[:2])
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return f">={major}.{minor},<{upper}"


def render(name: str, graphs: bool) -> dict[str, str]:
    """Every file of the plugin, by its path relative to the plugin folder."""
    values = placeholders(name, graphs)
    templates = {**FILES, **(GRAPH_FILES if graphs else {})}
    files = {}
    for template, target in templates.items():
        text = (TEMPLATES / template).read_text("utf-8")
        files[target.format(package=values["package"])] = string.Template(text).substitute(values)
    return files


def write(path: Path, files: dict[str, str]) -> None:
    """Write ``files`` under ``path`` (new or empty), all or nothing: into a temporary
    folder beside it, renamed into place once all are written."""
    try:
        _write(path, files)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else path
        reason = (
            "exists and is not a folder"
            if isinstance(exc, FileExistsError)
            else (exc.strerror or str(exc)).lower()
        )
        raise NewPluginError(
            f"cannot write the plugin to {path}: {where}: {reason}; choose a --path in a "
            "folder you can write to"
        ) from None
    logger.debug("wrote %d files to %s", len(files), path)


def _write(path: Path, files: dict[str, str]) -> None:
    if path.exists() and not path.is_dir():
        raise NewPluginError(f"{path} exists and is not a folder; choose another --path")
    if path.is_dir() and any(path.iterdir()):
        raise NewPluginError(
            f"{path} exists and is not empty; choose another --path or remove the folder"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkdtemp's folder is private (0700); the plugin folder inside it gets the usual mode.
    try:
        scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    except OSError as exc:  # it names a random folder; the user knows the one it goes in
        raise OSError(exc.errno, exc.strerror, str(path.parent)) from None
    try:
        staging = scratch / path.name
        for relative, text in files.items():
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, "utf-8")
        if path.is_dir():
            path.rmdir()  # empty, checked above
        os.replace(staging, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(result: dict[str, Any], path: Path) -> str:
    name = result["name"]
    # pip reads a bare relative name ("slotwise-acme") as a project on PyPI, not a folder.
    shown = str(path) if path.is_absolute() or str(path).startswith(".") else f"./{path}"
    lines = [f"wrote plugin {distribution(name)} for platform {name!r} to {shown}:"]
    lines += [f"  {file}" for file in result["files"]]
    lines += [
        "",
        "next steps:",
        f"  pip install -e {shown}",
        f"  export {devices_variable(name)}=1",
        f"  slotwise conformance {name}",
        "",
        f"then replace its TODO(vendor) lines in the order {shown}/README.md gives.",
    ]
    return "\n".join(lines)
