"""A Ctrl-C during the first import of torch's compiler leaves a process that cannot
compile; every later level-3 compile says so, names the interrupted import and says
to restart, instead of blaming a setting the user never made.

The interrupt is raised in a child process by an import hook, as the Nth module of
``torch._dynamo`` / ``torch._inductor`` starts importing; the child catches it (as a
notebook does) and then asks for level-3 compiles.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import clean_env

CHILD = """
import importlib.abc, json, sys
import torch

class InterruptAt(importlib.abc.MetaPathFinder):
    seen = 0

    def find_spec(self, name, path, target=None):
        if name.startswith(("torch._dynamo.", "torch._inductor.")):
            InterruptAt.seen += 1
            if InterruptAt.seen == int(sys.argv[1]):
                sys.meta_path.remove(self)
                raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, InterruptAt())
try:
    import torch._inductor
except KeyboardInterrupt:
    pass
else:
    raise SystemExit("the import ended before the interrupt")

from slotwise.compilation import CompilationConfig
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel

outcomes = []
for backend in ("inductor", "inductor", "eager"):
    config = CompilationConfig(
        level=3, backend=backend, splitting_ops=TOY_SPLITTING_OPS, cache_dir=sys.argv[2]
    )
    try:
        SillyModel(compilation_config=config)(torch.randn(5, 8))
        outcomes.append(["ran", ""])
    except Exception as exc:
        outcomes.append([type(exc).__name__, str(exc)])
print(json.dumps(outcomes))
"""


@pytest.mark.slow
@pytest.mark.parametrize("nth", [50, 100])
def test_every_compile_after_an_interrupted_import_says_to_restart(tmp_path, nth):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(nth), str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=300, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = json.loads(result.stdout.splitlines()[-1])
    for kind, message in outcomes:
        assert kind == "HalfImportedCompilerError", message
        assert "import of torch's compiler" in message and "was interrupted" in message
        assert "restart the Python process" in message
        assert "inductor_config" not in message
