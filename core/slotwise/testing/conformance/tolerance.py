"""How far a correct kernel may be from the float64 reference, from its dtype and reductions.

A fixed tolerance per dtype cannot judge a reduction: a bfloat16 attention that keeps
its running sums in bfloat16 stays within 3e-2 of the reference on 40 tokens and is
wrong by several times its own precision on 4,000, while an honest float32 kernel's
error barely grows.  So every bound here is built from what a correct kernel does:

- it rounds its output to the dtype: ``eps(dtype) x |expected|``, and values below
  the dtype's normal range to its subnormal spacing;
- it may round the inputs of a reduction to the dtype (FlashAttention's probabilities
  before the product with V): random rounding of n terms grows as their root sum of
  squares, ``eps(dtype) x sqrt(sum of squared terms)``;
- it accumulates in float32: ``eps(float32) x sqrt(n) x sum of |terms|`` over a
  reduction of length n.

``SAFETY`` covers the constants of these estimates; an error over the bound by that
margin is a kernel that rounds or accumulates in a narrower type than it should.
"""

from __future__ import annotations

import math

import torch

#: The factor between the estimates above and what a check allows.
SAFETY = 2.0
#: The accumulation precision every check expects of a kernel.
ACCUMULATION_DTYPE = torch.float32


def eps(dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` at 1 (twice its unit roundoff)."""
    return torch.finfo(dtype).eps


def subnormal_spacing(dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` below its smallest normal: the error floor of a tiny result."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


def rounding_bound(expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What rounding a float64 ``expected`` to ``dtype`` may cost, element by element."""
    return eps(dtype) * expected.abs() + subnormal_spacing(dtype)


def reduction_bound(
    expected: torch.Tensor,
    term_magnitude: torch.Tensor,
    dtype: torch.dtype,
    reduction_length: int,
) -> torch.Tensor:
    """The allowed error of an op whose elements each reduce ``reduction_length`` terms.

    ``term_magnitude`` is, per element (or broadcast to it), the size of what is added
    up: the sum of the terms' absolute values, or a row's scale for ops whose
    reduction is hidden (a norm's mean of squares).
    """
    accumulation = eps(ACCUMULATION_DTYPE) * math.sqrt(max(reduction_length, 1))
    return SAFETY * (rounding_bound(expected, dtype) + accumulation * term_magnitude)


def attention_bound(
    expected: torch.Tensor,
    weighted_rms: torch.Tensor,
    weighted_abs: torch.Tensor,
    score_magnitude: torch.Tensor,
    seq_lens: torch.Tensor,
    head_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The allowed error of attention in ``dtype``, per output element.

    For output ``o = sum_j p_j v_j`` over a request's ``seq_len`` keys:
    ``weighted_rms`` is ``sqrt(sum_j p_j^2 v_j^2)`` (the probabilities rounded to the
    dtype before the product), ``weighted_abs`` is ``sum_j p_j |v_j|`` (float32
    accumulation over ``seq_len`` terms), and ``score_magnitude`` the largest
    ``scale x sum_d |q_d k_d|`` of the row (float32 accumulation of each score over
    ``head_size`` terms, which the softmax turns into a relative error of the weights).
    ``seq_lens`` broadcasts against ``expected`` (one per token).
    """
    accumulation = eps(ACCUMULATION_DTYPE)
    dtype_terms = rounding_bound(expected, dtype) + eps(dtype) * weighted_rms
    float32_terms = (
        accumulation
        * weighted_abs
        * (seq_lens.double().sqrt() + math.sqrt(head_size) * score_magnitude)
    )
    return SAFETY * (dtype_terms + float32_terms)
