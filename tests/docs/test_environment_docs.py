"""Every environment variable slotwise reads is documented for users."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slotwise.envs import ENVIRONMENT_VARIABLES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", ["README.md", "docs/install.md"])
def test_user_docs_document_every_slotwise_variable(page):
    text = (ROOT / page).read_text()
    missing = [name for name in ENVIRONMENT_VARIABLES if f"`{name}`" not in text]
    assert not missing, f"{page} does not document {missing}"


def test_the_code_reads_no_undocumented_slotwise_variable():
    used = set()
    for path in (ROOT / "core" / "slotwise").rglob("*.py"):
        used |= set(re.findall(r"\"(SLOTWISE_[A-Z_]+)\"", path.read_text()))
    assert used <= set(ENVIRONMENT_VARIABLES), used - set(ENVIRONMENT_VARIABLES)
