"""Check ``device``: the platform calls slotwise makes at run time answer, and seeds hold.

The interface check reads the platform's attributes and signatures; this one calls what
runs later, far from the plugin's code: ``set_device`` (each process of a distributed
run claims its device with it), ``synchronize`` after queued work (graph capture and
the benchmarks wait on it), and a seeded ``torch.Generator`` on the device, which is
how the sampler draws a request with ``SamplingParams(seed=...)``: ``manual_seed``,
then ``exponential_(generator=...)`` row by row, step after step.  The same seed must
give the same draws and another seed others.  Draws are compared on the host.
"""

from __future__ import annotations

import pytest
import torch

from slotwise.testing.conformance import target

#: The seeds compared, and the size of one draw: a batch's rows over a small vocabulary.
SEED = 1234
OTHER_SEED = 4321
ROWS = 3
VOCAB = 512


def test_set_device_accepts_the_visible_devices() -> None:
    platform = target.platform()
    count = platform.device_count()
    devices = sorted({0, count - 1}) if type(count) is int and count >= 1 else [0]
    for device in [*devices, 0]:  # back to device 0, where the other checks run
        try:
            with target.calling(f"set_device({device})"):
                platform.set_device(device)
        except Exception as exc:  # noqa: BLE001 - reported with the device that raised it
            target.fail(
                f"set_device({device}) raised {type(exc).__name__}: {exc}; device_count() "
                f"is {count}, and each process of a distributed run claims device "
                "LOCAL_RANK with set_device(LOCAL_RANK)"
            )


def test_synchronize_returns_after_queued_work() -> None:
    platform = target.platform()
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(256, 256, generator=generator)
    on_device = values.to(platform.device_type)
    product = on_device @ on_device  # queued, on a device that runs asynchronously
    try:
        with target.calling("synchronize()"):
            platform.synchronize()
    except Exception as exc:  # noqa: BLE001 - a raise is the finding
        target.fail(
            f"synchronize() raised {type(exc).__name__}: {exc}; slotwise calls it after "
            "queuing work, around every static-graph capture and in the benchmarks"
        )
    if not torch.allclose(target.host(product), values @ values, rtol=1e-2, atol=1e-2):
        target.fail("after synchronize(), a product queued before it differs from the host's")


@pytest.mark.parametrize("draw", ["exponential_", "rand"])
def test_a_seeded_device_generator_repeats_its_draws(draw: str) -> None:
    """What a seeded request draws, twice with one seed and once with another."""
    first, again, other = (draws(seed, draw) for seed in (SEED, SEED, OTHER_SEED))
    what = f"{draw}(generator=torch.Generator({target.platform().device_type!r}))"
    for step, values in enumerate(first):
        bounds = (values > 0) if draw == "exponential_" else (values >= 0) & (values < 1)
        if not bool(bounds.all()):
            expected = "in (0, inf)" if draw == "exponential_" else "in [0, 1)"
            target.fail(f"{what} drew values outside {expected} in step {step + 1}")
    if not all(torch.equal(a, b) for a, b in zip(first, again, strict=True)):
        target.fail(
            f"{what} drew different values after manual_seed({SEED}) twice: the seed does "
            "not fix the generator's state, so a seeded request's tokens are not "
            "reproducible"
        )
    if torch.equal(first[0], other[0]):
        target.fail(
            f"{what} drew the same values after manual_seed({SEED}) and "
            f"manual_seed({OTHER_SEED}): the generator ignores the seed"
        )
    if torch.equal(first[0], first[1]):
        target.fail(f"{what} drew the same values in two steps: the generator does not advance")


def draws(seed: int, draw: str) -> list[torch.Tensor]:
    """Two steps of ``draw`` from a generator on the device seeded with ``seed``, each
    into a [ROWS, VOCAB] float32 tensor row by row (as the sampler does), on the host."""
    device = torch.device(target.platform().device_type)
    try:
        generator = torch.Generator(device).manual_seed(seed)
    except Exception as exc:  # noqa: BLE001 - a raise is the finding
        target.fail(
            f"torch.Generator({device.type!r}).manual_seed({seed}) raised "
            f"{type(exc).__name__}: {exc}; a request with SamplingParams(seed=...) draws "
            "from a generator on the device"
        )
    steps = []
    for _ in range(2):
        try:
            if draw == "rand":
                values = torch.rand(ROWS, VOCAB, generator=generator, device=device)
            else:
                values = torch.empty(ROWS, VOCAB, device=device)
                for row in range(ROWS):
                    values[row].exponential_(generator=generator)
        except Exception as exc:  # noqa: BLE001 - a raise is the finding
            target.fail(
                f"{draw} with a generator on {device.type!r} raised {type(exc).__name__}: {exc}"
            )
        steps.append(target.host(values))
    return steps
