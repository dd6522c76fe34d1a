"""``RequestParams``: what one request asks of the engine, checked when it is made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slotwise_engine.serving.errors import RequestError

if TYPE_CHECKING:
    from slotwise_engine.runner.sampling import SamplingParams

#: The largest seed ``torch.Generator.manual_seed`` takes (an unsigned 64-bit integer).
MAX_SEED = 2**64 - 1


class RequestParamsError(RequestError):
    """A field of ``RequestParams`` out of its range; the message names the field."""


@dataclass(frozen=True)
class RequestParams:
    """How one request is sampled and when it stops.

    ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1.0 keep every token; ``seed``
    makes a sampled request's tokens depend on the seed alone, not on the batch it runs
    in.  A request stops after ``max_tokens`` tokens ("length"), or ("stop") at a string
    of ``stop`` (left out of the text), at an id of ``stop_token_ids`` or at the model's
    end-of-sequence ids unless ``ignore_eos``.  Lists are accepted and kept as tuples.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _tuple(self.stop, "stop"))
        object.__setattr__(self, "stop_token_ids", _tuple(self.stop_token_ids, "stop_token_ids"))
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise RequestParamsError(f"max_tokens is {self.max_tokens!r}; ask for at least 1 token")
        if not _is_number(self.temperature) or not self.temperature >= 0:
            raise RequestParamsError(
                f"temperature is {self.temperature!r}; use a number >= 0 (0: greedy)"
            )
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise RequestParamsError(f"top_p is {self.top_p!r}; use a number in (0, 1] (1: all)")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise RequestParamsError(f"top_k is {self.top_k!r}; use an integer >= 0 (0: all)")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed <= MAX_SEED):
            raise RequestParamsError(
                f"seed is {self.seed!r}; use an integer from 0 to 2**64 - 1, or None"
            )
        for text in self.stop:
            if not isinstance(text, str) or not text:
                raise RequestParamsError(f"stop holds {text!r}; each stop string is non-empty text")
        for token in self.stop_token_ids:
            if not _is_int(token) or token < 0:
                raise RequestParamsError(
                    f"stop_token_ids holds {token!r}; each is a token id, an integer >= 0"
                )
        if not isinstance(self.ignore_eos, bool):
            raise RequestParamsError(f"ignore_eos is {self.ignore_eos!r}; use True or False")

    @property
    def sampling(self) -> SamplingParams:
        """The runner's sampling parameters of this request."""
        from slotwise_engine.runner.sampling import SamplingParams  # torch: on first use

        return SamplingParams(
            temperature=float(self.temperature),
            top_k=self.top_k,
            top_p=float(self.top_p),
            seed=self.seed,
        )


def _tuple(value: object, name: str) -> tuple:
    if isinstance(value, str | bytes):
        # One stop string is a common slip: "stop" is a list of strings.
        raise RequestParamsError(f"{name} is {value!r}; pass a list, e.g. [{value!r}]")
    try:
        return tuple(value)  # type: ignore[call-overload]
    except TypeError:
        raise RequestParamsError(f"{name} is {value!r}; pass a list") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))
