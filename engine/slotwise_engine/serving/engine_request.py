"""``EngineRequest``: one request inside the engine, from ``add_request`` to its end."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from slotwise_engine.runner.model_runner import Request
from slotwise_engine.serving.detokenizer import Detokenizer
from slotwise_engine.serving.request_params import RequestParams


@dataclass(eq=False)
class EngineRequest:
    """A request's tokens, its place in the cache and its progress.

    ``token_ids`` is the prompt and every token sampled so far; ``runner_request`` what
    the runner has seen of them: its ``tokens`` are the prefix revealed to the model so
    far (a prompt is revealed chunk by chunk), ``num_cached`` of them have their keys and
    values in ``block_ids``.  Preemption gives it a new, empty ``runner_request``: all of
    ``token_ids`` is computed again when it is scheduled next.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: RequestParams
    arrival_time: float
    detokenizer: Detokenizer
    #: Draws this request's sampled tokens when it has a seed; kept for its whole life.
    generator: torch.Generator | None = None
    token_ids: list[int] = field(init=False)
    runner_request: Request = field(init=False)
    first_token_time: float | None = None
    finished_time: float | None = None
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.runner_request = Request(tokens=[], block_ids=[])

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose keys and values are not in the cache yet: the prompt's rest, or
        the one sampled last."""
        return len(self.token_ids) - self.runner_request.num_cached

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)
