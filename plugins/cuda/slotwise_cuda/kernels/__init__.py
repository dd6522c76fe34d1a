"""Triton kernels for the CUDA platform, one concept per module.

- ``attention``: ``paged_prefill_attention`` (prefill, chunked prefill and decode as
  query length 1, variable lengths) and ``paged_decode_attention`` (one query token per
  sequence), both over a paged KV cache with grouped-query attention.
- ``layernorm``: ``rms_norm``.
- ``activation``: ``silu_and_mul``.
- ``rotary``: ``rotary_embedding`` (neox and gpt-j styles, in place).

Import the submodule you need: each imports torch and triton at module level, and only
the CUDA platform (or a test under ``TRITON_INTERPRET=1``) should pay for that.
"""
