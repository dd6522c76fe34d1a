"""``CpuCommunicator``: collectives between CPU processes, over gloo.

The base ``Communicator`` already runs every collective through torch.distributed;
this class pins the backend, so a CPU job handed a group of another backend fails at
start-up with a clear message rather than at its first collective.
"""

from __future__ import annotations

from slotwise.plugin_api import Communicator


class CpuCommunicator(Communicator):
    dist_backend = "gloo"
