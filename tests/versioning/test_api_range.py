"""``requires_api`` ranges read without ``packaging`` mean what ``packaging`` says they mean."""

from __future__ import annotations

import subprocess
import sys

import pytest
from packaging.specifiers import SpecifierSet

from slotwise.platforms.api_range import UPPER_BOUNDS, ApiRange

RANGES = [
    ">=1.0,<2",
    ">=1.1,<2",
    ">= 1.0 , < 2",
    ">=1.0.0,<2.0.0",
    ">1.0",
    ">1",
    "<=1.1",
    "<1.10",
    "==1.1",
    "==1",
    "!=1.1",
    ">=1,<1.10,!=1.2",
    "~=1.1",
    "==1.*",
    ">=1.0rc1,<2",
    ">=1.0.post1",
    ">=1.0,",  # packaging ignores the empty part
]
VERSIONS = ["0.9", "1", "1.0", "1.0.0", "1.1", "1.1.0", "1.1.1", "1.2", "1.9", "1.10", "2"]
VERSIONS += ["2.0", "3.0", "1.1rc1", "1.0.post1", "2.0.dev1"]


@pytest.mark.parametrize("text", RANGES)
def test_every_answer_is_packagings(text):
    expected = SpecifierSet(text)
    api_range = ApiRange(text)
    for version in VERSIONS:
        assert api_range.contains(version) == expected.contains(version, prereleases=True), (
            text,
            version,
        )
    assert api_range.has_upper_bound == any(s.operator in UPPER_BOUNDS for s in expected)


@pytest.mark.parametrize("text", [">=1.0,<<2", "1.0", ">=one", "=>1.0"])
def test_what_packaging_refuses_is_refused(text):
    with pytest.raises(ValueError):
        SpecifierSet(text)
    with pytest.raises(ValueError):
        ApiRange(text)


def test_resolving_a_platform_does_not_import_packaging():
    code = (
        "import sys, slotwise; slotwise.current_platform.name; "
        "print('packaging.specifiers' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
