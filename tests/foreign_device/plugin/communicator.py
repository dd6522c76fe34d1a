"""``HostStagedCommunicator``: collectives for a device without a collective library.

gloo moves host tensors only, so each collective copies its input to the host, runs
there and copies the result back to the device: what a vendor does before its own
torch.distributed backend exists.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slotwise.plugin_api import Communicator


class HostStagedCommunicator(Communicator):
    dist_backend = "gloo"

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return super().all_reduce(x.cpu()).to(x.device)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return super().all_gather(x.cpu(), dim).to(x.device)

    def reduce_scatter(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return super().reduce_scatter(x.cpu(), dim).to(x.device)

    def gather(self, x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        out = super().gather(x.cpu(), dst, dim)
        return None if out is None else out.to(x.device)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        if not x.is_contiguous():
            return super().broadcast(x, src)  # refused, with the base class's advice
        return x.copy_(super().broadcast(x.cpu(), src))

    def send(self, x: torch.Tensor, dst: int | None = None) -> None:
        super().send(x.cpu(), dst)

    def recv(
        self, shape: Sequence[int], dtype: torch.dtype, src: int | None = None
    ) -> torch.Tensor:
        src = (self.rank - 1) % self.world_size if src is None else src
        self._check_peer(src, "src")
        out = torch.empty(tuple(shape), dtype=dtype)
        with self.guard("recv"):
            torch.distributed.recv(out, group=self.group, group_src=src)
        return out.to(self.device)
