"""The inputs of a Dynamo graph as Dynamo traced them: fake tensors with the trace's
symbolic sizes.

Dynamo hands its backend the first call's *real* tensors. Faked afresh, a tensor either
takes that call's sizes as constants (1 for a one-token first call: every piece compiled
from it would serve that size only) or gets a fresh, sourceless symbol for every
dimension, weights included (Inductor's guards on those then break Dynamo's own guard
building: ``IndexError`` in ``produce_guards_verbose`` with a cold Inductor cache). So
every compile of a general piece starts from Dynamo's own record of each input.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._guards import TracingContext, detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode


def traced_inputs(example_inputs: list[Any]) -> list[Any]:
    """``example_inputs`` with every real tensor replaced by the fake Dynamo traced; a
    tensor Dynamo did not record is made static, as plain ``torch.compile`` keeps weights."""
    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()
    context = TracingContext.try_get()
    traced = []
    for value in example_inputs:
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            symbolic = None if context is None else context.tensor_to_context.get(value)
            if symbolic is None:
                value = fake_mode.from_tensor(value, static_shapes=True)
            else:
                value = fake_mode.from_tensor(
                    value, symbolic_context=symbolic, source=symbolic.tensor_source, trace=False
                )
        traced.append(value)
    return traced
