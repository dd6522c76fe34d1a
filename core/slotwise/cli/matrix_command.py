"""``slotwise matrix``: what every installed platform supports, side by side.

Every installed platform, available here or not, instantiated without probing any
hardware; each question is asked separately, so a plugin that breaks one cell shows an
error there, never a crash.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import slotwise
from slotwise.cli.table import format_table
from slotwise.plugins.manager import stdout_to_stderr

if TYPE_CHECKING:
    from slotwise.platforms import Platform
    from slotwise.platforms.resolution import PlatformEntry


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name, help="show what every installed platform supports (graph modes, attention, ...)"
    )
    style = parser.add_mutually_exclusive_group()
    style.add_argument("--json", action="store_true", help="print one JSON object")
    style.add_argument("--markdown", action="store_true", help="print a Markdown table")


def collect() -> dict[str, Any]:
    """The matrix as plain data: one dict per installed platform, highest priority first."""
    from slotwise.platforms import plugin_report
    from slotwise.platforms.resolution import get_resolver

    rows = [row for row in plugin_report() if row.kind == "platform"]
    entries = get_resolver().entries
    platforms = [_describe(entries[row.name], row.status, row.reason) for row in rows]
    return {
        "slotwise": slotwise.__version__,
        "api_version": slotwise.API_VERSION,
        "selected": next((p["name"] for p in platforms if p["status"] == "selected"), None),
        "platforms": platforms,
    }


def _describe(entry: PlatformEntry, status: str, reason: str) -> dict[str, Any]:
    """Everything the matrix shows about one platform; a question that fails leaves None
    as its answer and its error under ``errors``."""
    from slotwise.platforms.resolution import instantiate

    errors: dict[str, str] = {}
    platform = _ask(errors, "platform", lambda: instantiate(entry))
    listed = _ask(errors, "attention_backends", lambda: _attention_backends(entry.name))
    backends, classes = listed or (None, [])
    loaded = [b for b in backends or [] if "error" not in b]
    data: dict[str, Any] = {
        "name": entry.name,
        "status": status,
        "reason": reason,
        "plugin": f"{entry.plugin.distribution} {entry.plugin.version}",
        "priority": entry.spec.priority,
        "requires_api": entry.spec.requires_api,
        "graph_modes": None,
        "default_graph_mode": None,
        "attention_backends": backends,
        "dtypes": None if backends is None else sorted({d for b in loaded for d in b["dtypes"]}),
        "communicator": None,
        "compile_backend": None,
        "custom_op_key": None,
        "custom_ops": _ask(errors, "custom_ops", lambda: _custom_ops(entry.name)),
    }
    if platform is not None:
        _ask(errors, "piecewise_backend", lambda: _check_piecewise_backend(platform))
        pieces = "piecewise_backend" not in errors
        data["graph_modes"] = _ask(
            errors, "graph_modes", lambda: _graph_modes(platform, classes, pieces)
        )
        data["default_graph_mode"] = _ask(
            errors, "default_graph_mode", lambda: _default_graph_mode(platform)
        )
        data["communicator"] = _ask(errors, "communicator", lambda: _communicator(platform))
        data["compile_backend"] = platform.default_compile_backend
        data["custom_op_key"] = platform.custom_op_key
    data["errors"] = errors
    return data


def _ask(errors: dict[str, str], key: str, question: Callable[[], Any]) -> Any:
    """``question()``, or None with the error recorded under ``key``."""
    try:
        return question()
    except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the others
        errors[key] = f"{type(exc).__name__}: {exc}"
        return None


def _attention_backends(platform_name: str) -> tuple[list[dict[str, Any]], list[type]]:
    """The backends registered for the platform, by priority, described (one that fails to
    load says why), and the classes of those that load."""
    from slotwise.attention.registry import get_attention_backend_registry

    backends, classes = [], []
    for entry in get_attention_backend_registry().entries(platform_name):
        try:
            cls = entry.load()
            classes.append(cls)
            backend = {
                "name": cls.get_name(),
                "class": entry.label,
                "priority": entry.priority,
                "dtypes": [str(dtype).removeprefix("torch.") for dtype in cls.supported_dtypes],
                "head_sizes": _listing(cls.supported_head_sizes),
                "block_sizes": _listing(cls.supported_block_sizes),
                "graph_support": cls.graph_support.value,
            }
        except Exception as exc:  # noqa: BLE001 - shown in the backend's place
            backend = {"class": entry.label, "error": f"{type(exc).__name__}: {exc}"}
        backends.append(backend)
    return backends, classes


def _listing(values: tuple[int, ...] | None) -> list[int] | None:
    return None if values is None else list(values)


def _check_piecewise_backend(platform: Platform) -> None:
    """Raise what a compile would meet when the platform's own piecewise backend is broken."""
    from slotwise.compilation.splitting.piecewise_backend import AbstractPiecewiseBackend

    cls = platform.get_piecewise_backend_cls()
    if cls is not None and not (
        isinstance(cls, type) and issubclass(cls, AbstractPiecewiseBackend)
    ):
        raise TypeError(
            f"get_piecewise_backend_cls() returned {cls!r}, not an AbstractPiecewiseBackend "
            "subclass"
        )


def _graph_modes(platform: Platform, attention_backends: list[type], pieces: bool) -> list[str]:
    """The ``GraphMode``s a model can run in on this platform with one of its attention
    backends (``supported_graph_modes``): FULL modes need a backend that may be captured,
    piecewise modes a piecewise backend (``pieces``: the platform's own one works)."""
    from slotwise.compilation.config import GraphMode
    from slotwise.compilation.static_graphs.graph_modes import supported_graph_modes

    modes = {GraphMode.NONE}.union(
        *(supported_graph_modes(platform, cls) for cls in attention_backends)
    )
    return [
        mode.name
        for mode in GraphMode
        if mode in modes and (pieces or not mode.has_piecewise_graphs)
    ]


def _default_graph_mode(platform: Platform) -> dict[str, str]:
    """The mode a config without one gets here, and why (``default_graph_mode``, for
    the backend the platform selects)."""
    from slotwise.compilation.static_graphs.graph_modes import default_graph_mode

    return default_graph_mode(platform).as_dict()


def _communicator(platform: Platform) -> dict[str, Any]:
    from slotwise.distributed.communicator import communicator_class

    try:
        cls = communicator_class(platform)
    except NotImplementedError:
        cls = None
    name = None if cls is None else f"{cls.__module__}:{cls.__qualname__}"
    return {"backend": platform.dist_backend, "class": name}


def _custom_ops(platform_name: str) -> list[str]:
    from slotwise.custom_op import get_custom_op_registry

    return [op for op, platform in get_custom_op_registry().entries() if platform == platform_name]


def _names(backends: list[dict[str, Any]]) -> str:
    shown = [b.get("name") or f"{b['class']} (error, see notes)" for b in backends]
    return ", ".join(shown) or "none registered"


def _communicator_cell(communicator: dict[str, Any]) -> str:
    name = communicator["class"]
    return f"{communicator['backend']}: {name.partition(':')[2] if name else 'not implemented'}"


#: The table's rows: (label, key into a platform's data, how to show the value).
#: A value of None means the question failed; its error is in the notes.
ROWS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("status", "status", str),
    ("plugin", "plugin", str),
    ("priority", "priority", str),
    ("API range", "requires_api", str),
    ("graph modes", "graph_modes", ", ".join),
    ("default graph mode", "default_graph_mode", lambda choice: choice["mode"]),
    ("attention backends", "attention_backends", _names),
    ("dtypes", "dtypes", lambda dtypes: ", ".join(dtypes) or "none"),
    ("communicator", "communicator", _communicator_cell),
    ("compile backend", "compile_backend", str),
    ("custom-op key", "custom_op_key", lambda key: f"forward_{key}"),
    ("custom-op replacements", "custom_ops", lambda ops: ", ".join(ops) or "none"),
]


def _cells(info: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, rows (one per feature, one column per platform) and the notes below."""
    platforms = info["platforms"]
    header = ["feature", *(p["name"] for p in platforms)]
    rows = []
    for label, key, show in ROWS:
        cells = ["error, see notes" if p[key] is None else show(p[key]) for p in platforms]
        rows.append([label, *cells])
    labels = {key: label for label, key, _ in ROWS}
    labels["piecewise_backend"] = "piecewise backend (piecewise graph modes left out)"
    notes = []
    for platform in platforms:
        if platform["reason"] and platform["status"] != "selected":
            notes.append(f"{platform['name']} is {platform['status']}: {platform['reason']}")
        if platform["default_graph_mode"] is not None:
            choice = platform["default_graph_mode"]
            notes.append(
                f"{platform['name']} default graph mode {choice['mode']}: {choice['reason']}"
            )
        notes += [
            f"{platform['name']} {labels.get(key, key)}: {error}"
            for key, error in platform["errors"].items()
        ]
        notes += [
            f"{platform['name']} attention backend {b['class']}: {b['error']}"
            for b in platform["attention_backends"] or []
            if "error" in b
        ]
    return header, rows, notes


def render_table(info: dict[str, Any]) -> str:
    header, rows, notes = _cells(info)
    lines = [
        f"slotwise {info['slotwise']} (plugin API {info['api_version']}), "
        f"selected platform: {info['selected'] or 'none'}",
        "",
        format_table(header, rows),
    ]
    if notes:
        lines += ["", "notes:", *(f"  {note}" for note in notes)]
    return "\n".join(lines)


def render_markdown(info: dict[str, Any]) -> str:
    """A GitHub-flavoured Markdown table, ready to paste into documentation."""
    header, rows, notes = _cells(info)
    lines = [
        _markdown_row(header),
        _markdown_row(["---"] * len(header)),
        *(_markdown_row([f"**{row[0]}**", *row[1:]]) for row in rows),
    ]
    if notes:
        lines += ["", *(f"- {_escape(note)}" for note in notes)]
    return "\n".join(lines)


def _markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(_escape(cell) for cell in cells) + " |"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def run(args: argparse.Namespace) -> int:
    # stdout carries the answer alone: what plugin code prints while we ask goes to stderr.
    with stdout_to_stderr():
        info = collect()
    if not info["platforms"]:
        print("no platform plugin is installed; try 'pip install slotwise-cpu'")
        return 1
    if args.json:
        print(json.dumps(info, indent=2))
    elif args.markdown:
        print(render_markdown(info))
    else:
        print(render_table(info))
    return 0
