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
    rows = plugin_report()
    info["plugins"] = [row.as_dict() for row in rows]
    if isinstance(platform, UnspecifiedPlatform):
        info["error"] = platform.reason
    elif platform is not None:
        info["platform"] = platform.name
        info["selection"] = next((r.reason for r in rows if r.status == "selected"), "")
        info["devices"] = _devices(platform)
    return info


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _ask(method: Any, *args: Any) -> Any:
    """A platform answer, or a note that the platform does not implement it."""
    try:
        return method(*args)
    except NotImplementedError:
        return "not implemented"


def _devices(platform: Any) -> dict[str, Any]:
    count = _ask(platform.device_count)
    devices: dict[str, Any] = {"count": count, "list": []}
    if isinstance(count, int) and count > 0:
        # Devices of one platform in one machine are nearly always alike; show the first.
        devices["list"].append(
            {
                "index": 0,
                "name": _ask(platform.get_device_name, 0),
                "capability": _ask(platform.get_device_capability, 0),
                "total_memory": _ask(platform.total_memory, 0),
            }
        )
        devices["memory_in_use"] = _ask(platform.current_memory_usage, 0)
    return devices


def _bytes(value: Any) -> str:
    if not isinstance(value, int):
        return str(value)
    return f"{value / 1024**3:.1f} GiB" if value >= 1024**3 else f"{value / 1024**2:.0f} MiB"


def render(info: dict[str, Any]) -> str:
    lines = [
        f"slotwise {info['slotwise']} (plugin API {info['api_version']})",
        f"torch    {info['torch'] or 'not installed'}",
        f"python   {info['python']}",
        "",
    ]
    if info["platform"]:
        lines.append(f"platform {info['platform']}: {info['selection']}")
        devices = info["devices"]
        for device in devices["list"]:
            capability = device["capability"]
            lines.append(
                f"devices  {devices['count']} x {device['name']}, {_bytes(device['total_memory'])}"
                + (f", capability {capability}" if capability else "")
            )
        if "memory_in_use" in devices:
            lines.append(f"memory   {_bytes(devices['memory_in_use'])} in use by this process")
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
