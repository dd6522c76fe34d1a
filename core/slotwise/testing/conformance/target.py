"""The platform under test, and failure messages that name it.

The pytest plugin resolves the platform before collection.  The kit's own checks of a
result run on ``host`` copies, so a device need only implement the ops slotwise runs.
"""

from __future__ import annotations

from typing import NoReturn

import pytest
import torch

from slotwise import envs
from slotwise.platforms import Platform, get_current_platform
from slotwise.testing.conformance.session import CheckNotRun, calling

__all__ = ["calling", "expect_tensor", "fail", "host", "not_run", "platform", "skip"]


def platform_name() -> str:
    """The name given with ``--slotwise-platform``."""
    name = envs.get("SLOTWISE_PLATFORM")
    if name is None:
        pytest.fail(
            "the conformance suite runs as `pytest --slotwise-conformance "
            "--slotwise-platform=NAME` (or `slotwise conformance NAME`)",
            pytrace=False,
        )
    return name


def platform() -> Platform:
    """The platform object of this process, resolved from ``SLOTWISE_PLATFORM``."""
    platform_name()
    return get_current_platform()


def fail(problem: str) -> NoReturn:
    """Fail the running check with ``problem``, prefixed by the platform's name, without a
    traceback: the message is what the summary of ``slotwise conformance`` shows."""
    raise pytest.fail.Exception(f"platform {platform_name()!r}: {problem}", pytrace=False) from None


def skip(reason: str) -> NoReturn:
    """Skip the running check because it does not apply: the platform declares no such
    feature (no static graphs, a dtype its backend refuses).  Naming the platform."""
    pytest.skip(f"platform {platform_name()!r}: {reason}")


def not_run(reason: str) -> NoReturn:
    """The check applies but cannot run here (too few devices, say): reported as not
    run in the verdict, and a failure of the run under ``--require-all``."""
    raise CheckNotRun(f"platform {platform_name()!r}: {reason}")


def expect_tensor(
    what: str,
    got: object,
    *,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    device: torch.device | str,
) -> None:
    """Fail unless ``got`` is a tensor of ``dtype`` and ``shape`` on ``device``.

    Checked before any value: a result in float32 for bfloat16 inputs is closer to a
    float64 reference than the right answer, and a caller gets the wrong type anyway.
    """
    device = torch.device(device)
    if not isinstance(got, torch.Tensor):
        fail(f"{what} is a {type(got).__name__}, expected a tensor")
    problems = []
    if got.dtype != dtype:
        problems.append(f"dtype {got.dtype}, expected {dtype} (the inputs' dtype)")
    if tuple(got.shape) != tuple(shape):
        problems.append(f"shape {tuple(got.shape)}, expected {tuple(shape)}")
    if got.device.type != device.type or (
        device.index is not None and got.device.index != device.index
    ):
        problems.append(f"device {got.device}, expected {device}")
    if problems:
        fail(f"{what} has " + "; ".join(problems))


def host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the host, where the kit checks it: a device may lack ops (``abs``
    for bfloat16, say) that slotwise never runs on it but a check would."""
    return tensor.detach().cpu()
