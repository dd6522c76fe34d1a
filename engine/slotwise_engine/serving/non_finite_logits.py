"""Refusing logits no token can be drawn from: NaN, +inf, or only -inf in a row.

NaN weights or an activation overflowing float16 would otherwise give token 0, or
another meaningless one, step after step.  The sampler returns each row's largest
logit with its tokens at no cost (``Sampler.sample``), which is finite exactly when
the row is usable; the error names the requests, the model and its dtype, and what
to try.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slotwise.errors import SlotwiseError


class NonFiniteLogitsError(SlotwiseError):
    """A step's logits hold NaN or +inf, or only -inf: no token drawn from them means
    anything."""

    def __init__(self, subject: NonFiniteSubject, details: str) -> None:
        self.subject = subject
        self.details = details
        super().__init__(f"{subject}: {details}")

    def naming(self, noun: str, names: Sequence[str]) -> NonFiniteLogitsError:
        """The same error naming its requests otherwise (``generate``: by prompt index)."""
        subject = NonFiniteSubject(self.subject.position, noun, tuple(names), self.subject.source)
        return NonFiniteLogitsError(subject, self.details)


@dataclass(frozen=True)
class NonFiniteSubject:
    """Which token of which requests had the bad logits, and of which model."""

    position: int
    noun: str
    names: tuple[str, ...]
    source: str

    def __str__(self) -> str:
        plural = "s" if len(self.names) > 1 else ""
        return (
            f"the logits for token {self.position} of {self.noun}{plural} "
            f"{', '.join(self.names)} hold NaN or infinity ({self.source})"
        )


def to_host(tokens: torch.Tensor, maxima: torch.Tensor) -> tuple[list[int], list[float]]:
    """A step's tokens and its rows' largest logits (``Sampler.sample``) on the host,
    for one synchronisation: the maxima's copy is queued without waiting, and reading
    the tokens, queued after it on the same stream, waits for both."""
    maxima = maxima.to("cpu", non_blocking=True)
    return tokens.tolist(), maxima.tolist()


def non_finite_logits_error(
    model: object,
    checkpoint: str | os.PathLike[str] | None,
    *,
    position: int,
    names: Sequence[str],
    noun: str = "request",
) -> NonFiniteLogitsError:
    """The error for token ``position`` of the requests ``names``, whose logits are not
    finite: whether a weight of ``model`` is not finite tells a damaged (or, in a narrow
    dtype, unrepresentable) checkpoint from activations that overflow."""
    weights = dict(model.named_parameters()) if isinstance(model, torch.nn.Module) else {}
    dtype = next((w.dtype for w in weights.values() if w.is_floating_point()), None)
    dtype_name = "" if dtype is None else str(dtype).removeprefix("torch.")
    source = "the model" if checkpoint is None else f"checkpoint {os.fspath(checkpoint)}"
    source += f", {dtype_name}" if dtype_name else ""
    other_dtype = (
        'run it in float32 (slotwise generate --dtype float32, load_model(..., dtype="float32")) '
        "or in the dtype it was saved in (config.json's dtype, the default)"
    )
    broken = next((name for name, weight in weights.items() if not _finite(weight)), None)
    if broken is not None and dtype == torch.float32:
        why = (
            f"its weight {broken} holds NaN or infinity: the checkpoint is damaged; "
            "download or export it again"
        )
    elif broken is not None:
        why = (
            f"its weight {broken} holds NaN or infinity in {dtype_name}, from the checkpoint "
            f"or from a value {dtype_name} cannot hold; {other_dtype}, and if that fails, "
            "download or export the checkpoint again"
        )
    elif dtype is not None and dtype != torch.float32:
        largest = torch.finfo(dtype).max
        why = (
            f"its weights are finite, so an activation overflowed {dtype_name} "
            f"(largest value {largest:g}); {other_dtype}"
        )
    elif dtype == torch.float32:
        why = (
            "its weights are finite, so an activation overflowed float32 or a kernel wrote NaN; "
            "run it at -O0 (no compilation) to tell which, or in the dtype it was saved in"
        )
    else:
        why = other_dtype
    return NonFiniteLogitsError(NonFiniteSubject(position, noun, tuple(names), source), why)


def _finite(weight: torch.Tensor) -> bool:
    """Whether every value of ``weight`` is finite; NaN and infinities reach the least
    or the greatest value, so no temporary the size of the weight is made."""
    if not weight.is_floating_point() or weight.numel() == 0:
        return True
    least, greatest = torch.aminmax(weight.detach())
    return bool(least.isfinite() and greatest.isfinite())
