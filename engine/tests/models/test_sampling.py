"""Sampling on the device, batch-wise: each request's own parameters and seed, and
the distributions it promises (top-k, top-p, temperature), checked with fixed seeds."""

from __future__ import annotations

import math

import pytest
import torch

from slotwise_engine.runner.sampling import Sampler, SamplingParams

VOCAB = 50


def logits_rows(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def draws(params: SamplingParams, row: torch.Tensor, n: int = 4000) -> torch.Tensor:
    """``n`` independent draws from one row (n copies of it in one batch)."""
    torch.manual_seed(1234)
    return Sampler([params] * n, "cpu")(row.expand(n, -1))


def test_temperature_zero_is_the_argmax_whatever_else_is_set():
    logits = logits_rows(6)
    params = SamplingParams(temperature=0, top_k=3, top_p=0.5, seed=3)
    assert torch.equal(Sampler([params] * 6, "cpu")(logits), logits.argmax(-1))


def test_top_k_never_picks_outside_the_k_best_and_follows_their_softmax():
    row = logits_rows(1)[0]
    tokens = draws(SamplingParams(temperature=1.0, top_k=5), row)
    best = row.topk(5).indices
    assert set(tokens.tolist()) <= set(best.tolist())
    expected = row[best].softmax(-1)
    observed = torch.stack([(tokens == t).float().mean() for t in best])
    assert (observed - expected).abs().max() < 4 * math.sqrt(0.25 / len(tokens))


def test_top_p_keeps_the_smallest_set_with_enough_mass():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    row = probs.log()
    for top_p, kept in [(0.5, {1}), (0.8, {1, 3}), (0.81, {1, 2, 3}), (1.0, {0, 1, 2, 3})]:
        sampler = Sampler([SamplingParams(temperature=1.0, top_p=top_p)], "cpu")
        distribution = sampler.probabilities(row.unsqueeze(0))[0]
        assert set(distribution.nonzero().flatten().tolist()) == kept
        expected = torch.zeros(4)
        expected[list(kept)] = probs[list(kept)] / probs[list(kept)].sum()
        torch.testing.assert_close(distribution, expected)
    tokens = draws(SamplingParams(temperature=1.0, top_p=0.8), row)
    assert set(tokens.tolist()) == {1, 3}


def test_top_k_and_top_p_together_take_the_nucleus_of_the_top_k():
    row = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    sampler = Sampler([SamplingParams(temperature=1.0, top_k=2, top_p=0.6)], "cpu")
    # top-2 renormalised: 4/7, 3/7; 4/7 < 0.6, so both stay.
    torch.testing.assert_close(
        sampler.probabilities(row.unsqueeze(0))[0], torch.tensor([4 / 7, 3 / 7, 0, 0])
    )


def test_temperature_one_follows_the_softmax():
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    tokens = draws(SamplingParams(temperature=1.0), row, n=20000)
    observed = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert (observed - row.softmax(-1)).abs().max() < 4 * math.sqrt(0.25 / len(tokens))


def test_a_falling_temperature_tends_to_greedy():
    row = logits_rows(1, seed=5)[0]
    argmax = row.argmax().item()
    shares = [
        (draws(SamplingParams(temperature=t), row) == argmax).float().mean().item()
        for t in (2.0, 1.0, 0.5, 0.1, 1e-3)
    ]
    assert shares == sorted(shares)
    assert shares[-1] == 1.0 and shares[0] < 0.9


def test_a_tiny_temperature_does_not_overflow():
    row = torch.tensor([[1e4, -1e4, 0.0]])
    assert Sampler([SamplingParams(temperature=1e-30)], "cpu")(row).item() == 0


def run(sampler: Sampler, logits: torch.Tensor, steps: int) -> list[list[int]]:
    return [sampler(logits).tolist() for _ in range(steps)]


def test_the_same_seed_gives_the_same_tokens_in_any_batch():
    logits = logits_rows(3)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = run(Sampler([seeded], "cpu"), logits[:1], 8)
    other = SamplingParams(temperature=0.7, top_k=4)
    batch = run(Sampler([seeded, other, SamplingParams()], "cpu"), logits, 8)
    assert [step[0] for step in batch] == [step[0] for step in alone]
    assert run(Sampler([seeded], "cpu"), logits[:1], 8) == alone
    different = run(Sampler([SamplingParams(temperature=1.0, seed=43)], "cpu"), logits[:1], 8)
    assert different != alone


def test_per_request_parameters_in_one_batch():
    logits = logits_rows(3)
    params = [
        SamplingParams(),
        SamplingParams(temperature=5.0, top_k=1),
        SamplingParams(temperature=1e-4, seed=0),
    ]
    for _ in range(10):
        assert torch.equal(Sampler(params, "cpu")(logits), logits.argmax(-1))


def test_a_request_carries_its_generator_from_batch_to_batch():
    logits = logits_rows(2)
    a, b = SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=1.0, seed=2)
    reference = run(Sampler([b], "cpu"), logits[1:], 6)
    sampler = Sampler([a, b], "cpu")
    first = run(sampler, logits, 3)
    rest = run(Sampler([b], "cpu", generators=sampler.generators[1:]), logits[1:], 3)
    assert [step[1] for step in first] + [step[0] for step in rest] == [
        step[0] for step in reference
    ]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -0.1, "temperature is -0.1"),
        ("temperature", math.nan, "temperature is nan"),
        ("top_k", -1, "top_k is -1"),
        ("top_p", 0.0, r"top_p is 0.0; use a number in \(0, 1\]"),
        ("top_p", 1.5, "top_p is 1.5"),
    ],
)
def test_bad_parameters_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})
