"""Choosing each request's next token from its logits, for a whole batch at once.

Every request has its own ``SamplingParams``; the batch's are kept as tensors on the
logits' device, so one step costs a few tensor ops whatever the mix of greedy and
sampled requests, and the logits never go to the host.  A sampled token is drawn
by the exponential race: ``argmax(p / E)`` with ``E ~ Exp(1)`` per token picks token
i with probability p_i, and lets each seeded request draw its noise from its own
``torch.Generator``, so its tokens depend on its seed alone, not on the batch it
runs in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens.

    ``temperature`` 0 is greedy (the argmax; top-k, top-p and seed then change
    nothing).  ``top_k`` 0 keeps every token; ``top_p`` 1.0 turns nucleus sampling
    off.  ``seed`` None draws from torch's global generator.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature is {self.temperature}; use a number >= 0 (0: greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k is {self.top_k}; use an integer >= 0 (0: no limit)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p is {self.top_p}; use a number in (0, 1] (1: no limit)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def seeded_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """The generator a request with ``params`` draws from: its own for a seed, else None
    (torch's global one)."""
    return None if params.seed is None else torch.Generator(device).manual_seed(params.seed)


class Sampler:
    """Picks the next token of every request of a batch; row i of the logits is
    request i.  Seeded requests keep their generator from step to step.

    ``generators``: each request's (``seeded_generator``), for requests that go on from
    one batch to another; by default new ones from the seeds.
    """

    def __init__(
        self,
        params: Sequence[SamplingParams],
        device: torch.device | str,
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> None:
        self.params = list(params)
        self.device = torch.device(device)
        self.generators = (
            [seeded_generator(p, self.device) for p in self.params]
            if generators is None
            else list(generators)
        )
        if len(self.generators) != len(self.params):
            raise ValueError(
                f"{len(self.generators)} generators for {len(self.params)} sampling parameters"
            )
        self._set_tensors()

    def _set_tensors(self) -> None:
        params, device = self.params, self.device
        self.all_greedy = all(p.greedy for p in params)
        self.greedy = torch.tensor([p.greedy for p in params], device=device)
        # Greedy rows divide by 1: their sampled token is discarded anyway.
        self.temperature = torch.tensor(
            [p.temperature or 1.0 for p in params], dtype=torch.float32, device=device
        ).unsqueeze(1)
        self.filters = any(p.top_k or p.top_p < 1 for p in params if not p.greedy)
        self.top_k = torch.tensor([p.top_k for p in params], device=device)
        self.top_p = torch.tensor([p.top_p for p in params], device=device).unsqueeze(1)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token id of each row of ``logits`` [batch, vocab], as a [batch]
        tensor on the logits' device."""
        return self.sample(logits)[0]

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token id of each row of ``logits`` and the row's largest logit, both
        [batch] on the logits' device.

        The maximum comes out of the reduction the argmax makes anyway, and says whether
        a token can be drawn from the row: NaN wins any maximum and +inf any finite one,
        so it is finite exactly when the row holds no NaN, no +inf and not only -inf.
        A -inf logit alone is a token that is never drawn, which is what masking writes.
        """
        top, greedy = logits.max(-1)
        if self.all_greedy:
            return greedy, top
        probs = self.probabilities(logits, top)
        noise = torch.empty_like(probs)
        shared = [i for i, g in enumerate(self.generators) if g is None]
        if shared:
            noise[shared] = torch.empty_like(probs[shared]).exponential_()
        for i, generator in enumerate(self.generators):
            if generator is not None:
                noise[i].exponential_(generator=generator)
        # A zero draw would divide to inf (or 0/0 for a dropped token).
        sampled = probs.div_(noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(-1)
        return torch.where(self.greedy, greedy, sampled), top

    def probabilities(self, logits: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
        """Each row's sampling distribution after temperature, top-k and top-p; ``top``:
        each row's largest logit, where the caller has it already."""
        # Subtracting the max first keeps a tiny temperature from overflowing.
        scaled = logits.float()
        top = scaled.amax(-1) if top is None else top.float()
        scaled = (scaled - top.unsqueeze(-1)) / self.temperature
        if self.filters:
            scaled = self._filter(scaled)
        return scaled.softmax(-1)

    def _filter(self, scaled: torch.Tensor) -> torch.Tensor:
        """``scaled`` with -inf outside each row's top-k and its top-p nucleus: the
        fewest most likely tokens whose probability adds up to at least top_p."""
        ordered, order = scaled.sort(-1, descending=True)
        vocab = scaled.shape[-1]
        rank = torch.arange(vocab, device=scaled.device)
        top_k = torch.where(self.top_k > 0, self.top_k, vocab).unsqueeze(1)
        ordered = ordered.masked_fill(rank >= top_k, -math.inf)
        probs = ordered.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        # The most likely token always stays, whatever rounding does to the sums.
        drop = (mass_before >= self.top_p) & (rank > 0)
        ordered = ordered.masked_fill(drop, -math.inf)
        return torch.full_like(scaled, -math.inf).scatter_(-1, order, ordered)
