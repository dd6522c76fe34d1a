"""``Communicator``: the collectives model code needs, for one group of processes.

A platform names its class through ``Platform.get_communicator_cls()``;
``init_distributed`` builds one instance per process group (the world and the
tensor-parallel group).  This base class implements every collective on
``torch.distributed`` process groups, so it works unchanged with gloo, nccl or a
vendor backend registered with ``torch.distributed.Backend.register_backend``.  A
vendor subclasses it to check its backend, or to replace a collective with a faster
path (a custom all-reduce kernel, say) while inheriting the rest.

Rules every implementation keeps, because model code and the collective custom ops
rely on them:
- ranks passed to and reported by a communicator are ranks *within its group*;
- ``all_reduce``, ``all_gather``, ``reduce_scatter`` and ``gather`` return new,
  contiguous tensors and leave their input alone (``broadcast`` and ``recv`` write
  into a tensor, as the names say);
- a failure raises ``CollectiveError``, and ``DistributedTimeoutError`` when the
  group's timeout expired, never a bare backend error nor a hang.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from slotwise.platforms import Platform

from slotwise.distributed.errors import (
    CollectiveError,
    DistributedError,
    DistributedInitError,
    DistributedTimeoutError,
)

# torch 2.13 renamed the flat-tensor collectives (the old names warn); older releases
# have only the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Communicator:
    """Collectives over one ``torch.distributed`` process group; see the module docstring."""

    #: The ``torch.distributed`` backend this class needs its groups to use ("gloo",
    #: "nccl", a vendor's name); ``None`` accepts any.
    dist_backend: str | None = None

    def __init__(
        self,
        group: dist.ProcessGroup,
        *,
        name: str,
        device: torch.device,
        timeout: datetime.timedelta,
        **kwargs: Any,
    ) -> None:
        #: The backend the group actually runs on.
        self.backend: str = dist.get_backend(group)
        if self.dist_backend is not None and self.backend != self.dist_backend:
            raise DistributedInitError(
                f"{type(self).__name__} runs on the {self.dist_backend!r} backend, but group "
                f"{name!r} uses {self.backend!r}; call init_distributed() without backend= "
                "so the platform's backend is used"
            )
        self.group = group
        #: The group's name in slotwise ("world", "tp"), as the collective ops take it.
        self.name = name
        #: Where ``recv`` allocates and where tensors passed in must live.
        self.device = device
        self.timeout = timeout
        self.rank: int = dist.get_rank(group)
        self.world_size: int = dist.get_world_size(group)
        #: Global ranks of the group's members, in group-rank order.
        self.ranks: list[int] = dist.get_process_group_ranks(group)
        self._destroyed = False

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} rank {self.rank} of {self.world_size}, "
            f"backend {self.backend!r}>"
        )

    # -- collectives ---------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``x`` over the group, on every rank."""
        out = x.clone(memory_format=torch.contiguous_format)
        with self.guard("all_reduce"):
            dist.all_reduce(out, group=self.group)
        return out

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` in rank order, on every rank."""
        dim = self._dim(x, dim)
        # The backends gather into rank-major rows: (world * x.shape[0], ...).
        flat = x.new_empty((self.world_size * x.shape[0], *x.shape[1:]))
        with self.guard("all_gather"):
            _all_gather_single(flat, x.contiguous(), group=self.group)
        # (world, ..., n, ...) -> (..., world * n, ...): rank r's block lands at r * n.
        stacked = flat.view(self.world_size, *x.shape)
        shape = (*x.shape[:dim], self.world_size * x.shape[dim], *x.shape[dim + 1 :])
        return stacked.movedim(0, dim).reshape(shape).contiguous()

    def reduce_scatter(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Sum ``x`` over the group and give rank r the r-th of ``world_size`` equal
        chunks along ``dim``."""
        dim = self._dim(x, dim)
        if x.shape[dim] % self.world_size:
            raise ValueError(
                f"reduce_scatter over {self.world_size} ranks needs dim {dim} of {tuple(x.shape)} "
                f"to be a multiple of {self.world_size}; pad the tensor"
            )
        leading = x.movedim(dim, 0).contiguous()
        out = leading.new_empty((leading.shape[0] // self.world_size, *leading.shape[1:]))
        with self.guard("reduce_scatter"):
            _reduce_scatter_single(out, leading, group=self.group)
        return out.movedim(0, dim).contiguous()

    def gather(self, x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Every rank's ``x`` concatenated along ``dim`` on rank ``dst``; ``None`` elsewhere."""
        dim = self._dim(x, dim)
        self._check_rank(dst, "dst")
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == dst else None
        with self.guard("gather"):
            dist.gather(x.contiguous(), parts, group=self.group, group_dst=dst)
        return None if parts is None else torch.cat(parts, dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``x`` on every rank with rank ``src``'s, and return it."""
        self._check_rank(src, "src")
        if not x.is_contiguous():
            raise ValueError(
                "broadcast writes into x, so x must be contiguous; pass x.contiguous()"
            )
        with self.guard("broadcast"):
            dist.broadcast(x, group=self.group, group_src=src)
        return x

    def send(self, x: torch.Tensor, dst: int | None = None) -> None:
        """Send ``x`` to rank ``dst`` (default: the next rank), which must ``recv`` it."""
        dst = (self.rank + 1) % self.world_size if dst is None else dst
        self._check_peer(dst, "dst")
        with self.guard("send"):
            dist.send(x.contiguous(), group=self.group, group_dst=dst)

    def recv(
        self, shape: Sequence[int], dtype: torch.dtype, src: int | None = None
    ) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` sent by rank ``src`` (default: the previous)."""
        src = (self.rank - 1) % self.world_size if src is None else src
        self._check_peer(src, "src")
        out = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        with self.guard("recv"):
            dist.recv(out, group=self.group, group_src=src)
        return out

    def barrier(self) -> None:
        """Return once every rank of the group has reached its barrier."""
        with self.guard("barrier"):
            dist.barrier(group=self.group)

    def destroy(self) -> None:
        """Release what the communicator holds; any later collective raises.

        ``shutdown_distributed`` calls this before it destroys the process groups,
        which the communicator does not own.  Subclasses holding buffers or vendor
        handles free them here and call ``super().destroy()``.
        """
        self._destroyed = True

    # -- helpers -------------------------------------------------------------------

    @contextlib.contextmanager
    def guard(self, op: str) -> Iterator[None]:
        """Wrap one collective named ``op``: refuse it after ``destroy()``, and turn the
        backend's errors into ``CollectiveError``/``DistributedTimeoutError`` with advice.
        Subclasses that override a collective wrap their own calls in it too."""
        if self._destroyed:
            raise DistributedInitError(
                f"{op} on group {self.name!r} after shutdown_distributed(); "
                "call init_distributed() again first"
            )
        try:
            yield
        except DistributedError:
            raise
        except RuntimeError as error:  # torch.distributed.DistError is a RuntimeError
            raise self._translate(op, error) from error

    def _translate(self, op: str, error: RuntimeError) -> CollectiveError:
        lines = str(error).strip().splitlines()
        cause = lines[0] if lines else type(error).__name__
        where = (
            f"{op} on group {self.name!r} (rank {self.rank} of {self.world_size}, {self.backend})"
        )
        seconds = self.timeout.total_seconds()
        if "timed out" in cause.lower() or "timeout" in cause.lower():
            return DistributedTimeoutError(
                f"{where} did not complete within the {seconds:g} s timeout: another rank is "
                f"stuck, slower than that, or never called {op}. Check the other ranks' logs; "
                "if the work is only slow, raise SLOTWISE_DIST_TIMEOUT or "
                f"init_distributed(timeout=...). Backend said: {cause}"
            )
        return CollectiveError(
            f"{where} failed: another rank probably exited or lost its connection, or the "
            "ranks passed tensors that do not match. The rank that exited logged its own "
            f"error first; fix that and restart every rank. Backend said: {cause}"
        )

    def _dim(self, x: torch.Tensor, dim: int) -> int:
        if not -x.dim() <= dim < x.dim():
            raise ValueError(f"dim {dim} is out of range for a tensor of shape {tuple(x.shape)}")
        return dim % x.dim()

    def _check_rank(self, rank: int, argument: str) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(
                f"{argument}={rank} is not a rank of group {self.name!r}; "
                f"its ranks run from 0 to {self.world_size - 1}"
            )

    def _check_peer(self, rank: int, argument: str) -> None:
        self._check_rank(rank, argument)
        if rank == self.rank:
            raise ValueError(f"{argument}={rank} is this rank itself; point-to-point needs a peer")


def communicator_class(platform: Platform) -> type[Communicator]:
    """The platform's ``Communicator`` subclass, or the base class when it names none."""
    return platform.get_communicator_cls() or Communicator
