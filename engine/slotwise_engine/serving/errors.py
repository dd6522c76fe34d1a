"""The errors a caller of the engine can act on, each naming the problem and the fix."""

from __future__ import annotations

from slotwise.errors import SlotwiseError


class RequestError(SlotwiseError, ValueError):
    """A request the engine refuses before it takes cache blocks: a bad prompt, a duplicate
    id, parameters the engine cannot honour.  A ValueError, so a server answers it with 400."""


class QueueFullError(SlotwiseError):
    """More requests wait than the async engine queues; retry later (a server's 503)."""


class SchedulerStalledError(SlotwiseError):
    """Requests wait but none could be scheduled: the cache the scheduler started with
    was taken by something else."""
