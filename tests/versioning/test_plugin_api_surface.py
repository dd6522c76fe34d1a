"""The plugin API (``slotwise.plugin_api`` and the hook specs) against its snapshot:
a change to a name or a signature must come with an ``API_VERSION`` change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slotwise.testing.api_surface import surface
from slotwise.version import API_VERSION

SNAPSHOT = Path(__file__).with_name("plugin_api_surface.json")
REGENERATE = f"python -m slotwise.testing.api_surface --write {os.path.relpath(SNAPSHOT)}"


def test_the_plugin_api_matches_its_snapshot_for_this_api_version():
    recorded = json.loads(SNAPSHOT.read_text())
    current = surface()
    if current == recorded:
        return
    changed = sorted(
        name
        for part in ("hooks", "names")
        for name in set(current[part]) | set(recorded[part])
        if current[part].get(name) != recorded[part].get(name)
    )
    assert recorded["api_version"] != API_VERSION, (
        f"the plugin API changed ({', '.join(changed)}) but API_VERSION is still "
        f"{API_VERSION}: change slotwise/version.py as docs/api-versioning.md says (minor for "
        f"additions, major for anything else), then run: {REGENERATE}"
    )
    raise AssertionError(f"API_VERSION is {API_VERSION}; record the new surface: {REGENERATE}")


def test_the_plugin_api_loads_nothing_heavy_until_a_name_is_used():
    code = (
        "import sys, slotwise.plugin_api as api; assert api.Platform and api.hookimpl; "
        "print(sorted(m for m in ('torch', 'safetensors', 'tokenizers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_unknown_names_list_the_plugin_api():
    import pytest

    import slotwise.plugin_api as api

    with pytest.raises(AttributeError, match="the plugin API is: .*Platform"):
        api.Platfrom  # noqa: B018
