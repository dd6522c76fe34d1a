"""pluggy's documented hookimpl options, through real entry points: ``tryfirst`` and
``trylast`` order a plugin's hook among the others; wrappers are refused by name."""

from __future__ import annotations

import json

import pytest

CALL_ORDER = """
import json
import calls
from slotwise.platforms import plugin_report
report = {r.name: [r.status, r.reason] for r in plugin_report()}
print(json.dumps(calls.ORDER))
print(json.dumps(report))
"""


def recording_plugin(name: str, options: str = "") -> str:
    """A plugin whose platforms hook records that it ran, marked ``@hookimpl(options)``."""
    return f"""
        import calls
        from slotwise.plugin_api import hookimpl

        @hookimpl({options})
        def slotwise_platforms():
            calls.ORDER.append({name!r})
            return []
    """


@pytest.fixture
def recorded(dists):
    (dists.root / "calls.py").write_text("ORDER = []\n")
    return dists


def call_order(dists) -> list[str]:
    result = dists.run(CALL_ORDER)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[0])


@pytest.mark.parametrize(
    "options, expected",
    [
        ({}, ["zeta", "alpha"]),  # pluggy's default: the latest registered first
        ({"alpha": "tryfirst=True"}, ["alpha", "zeta"]),
        ({"zeta": "trylast=True"}, ["alpha", "zeta"]),
    ],
)
def test_tryfirst_and_trylast_order_the_calls_as_in_pluggy(recorded, options, expected):
    for name in ("alpha", "zeta"):  # registered in entry-point name order
        recorded.add(f"slotwise-{name}", recording_plugin(name, options.get(name, "")))
    assert call_order(recorded) == expected


@pytest.mark.parametrize("option", ["wrapper=True", "hookwrapper=True"])
def test_a_hook_wrapper_fails_its_plugin_with_an_error_naming_it(recorded, option):
    recorded.add("slotwise-alpha", recording_plugin("alpha"))
    wrapper = recording_plugin("wrapped", option).replace(
        "            return []", "            yield\n            return []"
    )
    recorded.add("slotwise-wrapped", wrapper)
    result = recorded.run(CALL_ORDER)
    assert result.returncode == 0, result.stderr
    order_line, report_line = result.stdout.splitlines()[:2]
    assert json.loads(order_line) == ["alpha"]
    status, reason = json.loads(report_line)["slotwise_wrapped"]
    assert status == "failed"
    assert "slotwise_platforms as a hook wrapper" in reason and "tryfirst" in reason
    assert "slotwise-wrapped" in result.stderr
