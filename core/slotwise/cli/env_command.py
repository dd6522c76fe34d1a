"""``slotwise env``: what is installed, which platform won and why, the devices."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform as _pyplatform
from typing import Any

import slotwise
from slotwise import envs
from slotwise.cli.table import format_table
from slotwise.platforms import PlatformError, get_current_platform, plugin_report
from slotwise.platforms.unspecified import UnspecifiedPlatform
from slotwise.plugins.manager import stdout_to_stderr


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(name, help="show versions, plugins, the selected platform")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def collect() -> dict[str, Any]:
    """Everything `slotwise env` shows, as plain data."""
    # Here, not at the top: they import torch, which parsing any command must not.
    from slotwise.attention.registry import get_attention_backend_registry
    from slotwise.compilation.static_graphs import graph_modes
    from slotwise.custom_op import get_custom_op_registry

    info: dict[str, Any] = {
        "slotwise": slotwise.__version__,
        "api_version": slotwise.API_VERSION,
        "python": _pyplatform.python_version(),
        "torch": _distribution_version("torch"),
        "platform": None,
        "selection": "",
        "error": None,
        "devices": None,
        "environment": {
            name: value for name in envs.ENVIRONMENT_VARIABLES if (value := envs.get(name))
        },
    }
    try:
        platform = get_current_platform()
    except PlatformError as exc:
        info["error"] = str(exc)
        platform = None
    # The registration hooks run as a model's first layer would run them, so a plugin
    # whose hook raises is shown failed here, not selected and found broken later.
    get_attention_backend_registry()
    get_custom_op_registry()
    rows = plugin_report()
    info["plugins"] = [row.as_dict() for row in rows]
    if isinstance(platform, UnspecifiedPlatform):
        info["error"] = platform.reason
    elif platform is not None:
        row = next((r for r in rows if r.kind == "platform" and r.name == platform.name), None)
        if row is not None and row.status == "failed":  # in a registration hook, after selection
            info["error"] = (
                f"platform {row.name!r} is unusable: plugin {row.plugin!r} (distribution "
                f"{row.distribution} {row.version}) failed: {row.reason}"
            )
        else:
            info["platform"] = platform.name
            info["selection"] = row.reason if row is not None else ""
            info["devices"] = _devices(platform)
            info["default_graph_mode"] = graph_modes.default_graph_mode_report(platform)
    return info


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _devices(platform: Any) -> dict[str, Any]:
    """The platform's devices; an answer it cannot give is None, with the reason under
    ``unanswered`` (method name -> "not implemented" or the error it raised)."""
    unanswered: dict[str, str] = {}

    def ask(method: str, *args: Any) -> Any:
        try:
            return getattr(platform, method)(*args)
        except NotImplementedError:
            unanswered[method] = "not implemented"
        except Exception as exc:  # noqa: BLE001 - one broken answer must not hide the rest
            unanswered[method] = f"raised {type(exc).__name__}: {exc}"
        return None

    count = ask("device_count")
    devices: dict[str, Any] = {"count": count, "list": [], "memory_in_use": None}
    if isinstance(count, int) and count > 0:
        # Devices of one platform in one machine are nearly always alike; show the first.
        devices["list"].append(
            {
                "index": 0,
                "name": ask("get_device_name", 0),
                "capability": ask("get_device_capability", 0),
                "total_memory": ask("total_memory", 0),
            }
        )
        devices["memory_in_use"] = ask("current_memory_usage", 0)
    devices["unanswered"] = unanswered
    return devices


def _bytes(value: int) -> str:
    return f"{value / 1024**3:.1f} GiB" if value >= 1024**3 else f"{value / 1024**2:.0f} MiB"


def _device_lines(platform: str, devices: dict[str, Any]) -> list[str]:
    """What is known of the devices, each fact only when the platform gave it."""
    lines = []
    if isinstance(devices["count"], int):
        for device in devices["list"]:
            name = device["name"]
            facts = [f"{devices['count']} x {name}" if name else str(devices["count"])]
            if isinstance(device["total_memory"], int):
                facts.append(_bytes(device["total_memory"]))
            if device["capability"]:
                facts.append(f"capability {device['capability']}")
            lines.append("devices  " + ", ".join(facts))
        if not devices["list"]:
            lines.append(f"devices  {devices['count']}")
    if isinstance(devices["memory_in_use"], int):
        lines.append(f"memory   {_bytes(devices['memory_in_use'])} in use by this process")
    for method, why in devices["unanswered"].items():
        by = f"{why} by platform {platform}" if why == "not implemented" else f"{platform} {why}"
        lines.append(f"unknown  {method} ({by})")
    return lines


def render(info: dict[str, Any]) -> str:
    lines = [
        f"slotwise {info['slotwise']} (plugin API {info['api_version']})",
        f"torch    {info['torch'] or 'not installed'}",
        f"python   {info['python']}",
        "",
    ]
    if info["platform"]:
        lines.append(f"platform {info['platform']}: {info['selection']}")
        lines += _device_lines(info["platform"], info["devices"])
        lines.append("graphs   {mode} by default: {reason}".format(**info["default_graph_mode"]))
    else:
        lines.append(f"platform none: {info['error']}")
    for name, value in info["environment"].items():
        lines.append(f"set      {name}={value}")
    lines += ["", "plugins:"]
    header = ["name", "kind", "distribution", "version", "priority", "status", "reason"]
    table = [
        [
            row["name"],
            row["kind"],
            row["distribution"],
            row["version"],
            "" if row["priority"] is None else str(row["priority"]),
            row["status"],
            row["reason"],
        ]
        for row in info["plugins"]
    ]
    lines.append(format_table(header, table) if table else "  (none installed)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # stdout carries the answer alone: what plugin code prints while we ask goes to stderr.
    with stdout_to_stderr():
        info = collect()
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0 if info["platform"] else 1
