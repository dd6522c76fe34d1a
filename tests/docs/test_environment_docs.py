"""Every environment variable slotwise reads is documented for users."""

from __future__ import annotations

import re
from pathlib import Path

from slotwise.envs import ENVIRONMENT_VARIABLES

ROOT = Path(__file__).resolve().parents[2]


def test_readme_documents_every_slotwise_variable():
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in ENVIRONMENT_VARIABLES if f"`{name}`" not in readme]
    assert not missing, f"README.md does not document {missing}"


def test_the_code_reads_no_undocumented_slotwise_variable():
    used = set()
    for path in (ROOT / "core" / "slotwise").rglob("*.py"):
        used |= set(re.findall(r"\"(SLOTWISE_[A-Z_]+)\"", path.read_text()))
    assert used <= set(ENVIRONMENT_VARIABLES), used - set(ENVIRONMENT_VARIABLES)
