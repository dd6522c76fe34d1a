"""Errors of distributed execution, split by when they happen; ``DistributedError``
catches all of them."""

from __future__ import annotations

from slotwise.errors import SlotwiseError


class DistributedError(SlotwiseError, RuntimeError):
    """Base of slotwise's distributed errors."""


class DistributedInitError(DistributedError):
    """``init_distributed`` cannot set up the process groups (arguments, environment,
    rendezvous), or a communicator is asked for before that or after shutdown."""


class CollectiveError(DistributedError):
    """A collective failed after start-up: a peer exited or a connection broke."""


class DistributedTimeoutError(CollectiveError, TimeoutError):
    """A collective did not complete within the timeout (``SLOTWISE_DIST_TIMEOUT``)."""


class RankDisagreementError(DistributedError):
    """Ranks that must hold the same inputs do not; raised on every rank of the group,
    with the same message, by ``check_ranks_agree``."""
