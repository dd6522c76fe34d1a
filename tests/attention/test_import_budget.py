"""Attention costs nothing until used: plugins register backends without importing torch.

Every bundled plugin by design: the hooks of all the plugins users install run as
discovery runs them, through their entry points, and are seen only by the class paths
they register.
"""

from __future__ import annotations

REGISTER_WITHOUT_TORCH = """
import sys
import slotwise
from slotwise.plugins import get_plugin_manager

assert slotwise.current_platform.name == "cpu"

from slotwise.platforms.resolution import declared_platforms

class Recorder:
    # The registry's interface, recording instead of importing the backend classes.

    def __init__(self, own_platforms=()):
        self.own_platforms = own_platforms
        self.seen = []

    def register(self, platform, backend, priority=0):
        self.seen.append((platform, backend))

    def register_own(self, backend, priority=0):
        self.register(*self.own_platforms, backend, priority)

    def registrations(self):
        return self.seen

    def merge(self, other, source):
        self.seen += other.seen

recorder = get_plugin_manager().register_all(
    "slotwise_register_attention_backends", Recorder, declared_platforms()
)
print(sorted(recorder.seen))
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""

OP_REGISTERED_ON_IMPORT = """
import torch
import slotwise
print(hasattr(torch.ops.slotwise, "unified_attention_with_output"))
import slotwise.attention
print(hasattr(torch.ops.slotwise, "unified_attention_with_output"))
"""


def test_backend_hooks_do_not_import_torch(dists):
    result = dists.run(REGISTER_WITHOUT_TORCH, SLOTWISE_PLATFORM="cpu")
    assert result.returncode == 0, result.stderr
    seen, torch_modules = result.stdout.splitlines()
    assert "slotwise_cpu.attention:CpuSdpaBackend" in seen
    assert "slotwise_cuda.attention:TritonPagedBackend" in seen
    assert "slotwise_ascend_stub.attention:AscendStubReferenceBackend" in seen
    assert torch_modules == "[]"


def test_the_op_is_registered_by_importing_slotwise_attention(dists):
    result = dists.run(OP_REGISTERED_ON_IMPORT)
    assert result.stdout.split() == ["False", "True"], result.stderr
