"""Attention backends with the bugs vendors actually ship fail the attention check, readably.

Each is a throwaway distribution whose platform is the CPU's under another name, with
CPU_SDPA broken in one way: it ignores the layer's scale, pairs query heads with the
wrong key/value heads (``repeat`` where ``repeat_interleave`` belongs), or aligns the
causal mask top-left, forgetting the cached context.  Each must fail exactly the
``attention`` check, with a message that points at the wrong element: its token,
request, head and dim, and got and expected values that visibly differ.
"""

from __future__ import annotations

import re
import textwrap

import pytest
from conformance_runs import outcomes, run_cli

from slotwise.testing.conformance.test_attention import DTYPE_LAYOUTS, NUM_KV_HEADS, SCENARIOS

pytestmark = pytest.mark.slow

#: The CPU platform as "broken_attention", serving ``broken_attention:BrokenBackend``.
PLUGIN = """
    from slotwise.platforms import PlatformSpec
    from slotwise.plugins import hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class BrokenAttentionPlatform(CpuPlatform):
        name = "broken_attention"

    @hookimpl
    def slotwise_platforms():
        platform_cls = "slotwise_broken_attention:BrokenAttentionPlatform"
        return [PlatformSpec("broken_attention", platform_cls, lambda: True, priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register("broken_attention", "broken_attention:BrokenBackend")
"""

#: ``BrokenImpl`` is each test's own; the backend around it is always the same.
BACKEND = """
    import torch
    import torch.nn.functional as F
    from slotwise_cpu.attention import CpuSdpaBackend, CpuSdpaImpl

    {impl}

    class BrokenBackend(CpuSdpaBackend):
        @classmethod
        def get_name(cls):
            return "BROKEN"

        @classmethod
        def get_impl_cls(cls):
            return BrokenImpl
"""

#: SDPA's default scale, 1/sqrt(head_size), whatever the layer was built with.
IGNORES_SCALE = """
    class BrokenImpl(CpuSdpaImpl):
        def _sdpa(self, q, k, v, **kwargs):
            return F.scaled_dot_product_attention(
                q, k, v, enable_gqa=self.num_queries_per_kv > 1, **kwargs
            )
"""

#: Key/value heads tiled (0, 1, 0, 1, ...) instead of each serving its own group of
#: consecutive query heads (0, 0, 1, 1, ...): query head 0 is right, others are not.
GQA_WITH_REPEAT = """
    class BrokenImpl(CpuSdpaImpl):
        def _sdpa(self, q, k, v, **kwargs):
            group = self.num_queries_per_kv
            heads = -3  # [..., heads, positions, head_size]
            k = torch.cat([k] * group, dim=heads)
            v = torch.cat([v] * group, dim=heads)
            return F.scaled_dot_product_attention(q, k, v, scale=self.scale, **kwargs)
"""

#: SDPA's is_causal for every prefill: right without cached context, wrong with it.
TOP_LEFT_CAUSAL_MASK = """
    class BrokenImpl(CpuSdpaImpl):
        def _prefill(self, q, key_cache, value_cache, block_table, seq_len):
            block_size = key_cache.shape[2]  # [blocks, kv heads, block size, D]
            blocks = block_table[: -(-seq_len // block_size)]
            keys = key_cache[blocks].transpose(0, 1).flatten(1, 2)[:, :seq_len]
            values = value_cache[blocks].transpose(0, 1).flatten(1, 2)[:, :seq_len]
            out = self._sdpa(q.transpose(0, 1), keys, values, is_causal=True)
            return out.transpose(0, 1)
"""

#: A value worked out once per step, in the step's cache, but one that differs between
#: layers: every layer of the step then attends with the first layer's scale.
SCALE_KEPT_PER_STEP = """
    class BrokenImpl(CpuSdpaImpl):
        def forward(self, layer, q, k, v, kv_cache, metadata, output):
            self.scale = metadata.step_cache.setdefault("broken-scale", self.scale)
            return super().forward(layer, q, k, v, kv_cache, metadata, output)
"""

#: What names the worst element in a failure message, and the values found there.
WORST = re.compile(
    r"worst at token (\d+) \(request (\d+), query token (\d+) of (\d+), at position (\d+) "
    r"after (\d+) cached\), head (\d+) \(reads key/value head (\d+)\), dim (\d+): "
    r"got (\S+), expected (\S+)$"
)


def failed_cases(dists, impl: str) -> dict[str, str]:
    """Run the suite on a CPU platform with ``impl`` as its attention; assert that only
    the attention check fails and return the message of each of its failed cases."""
    (dists.root / "broken_attention.py").write_text(
        textwrap.dedent(BACKEND).format(impl=textwrap.dedent(impl))
    )
    dists.add("slotwise-broken-attention", PLUGIN)
    summary, result = run_cli("broken_attention", site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    failed = {check for check, outcome in outcomes(summary).items() if outcome == "failed"}
    assert failed == {"attention"}, summary
    tests = next(c["tests"] for c in summary["checks"] if c["check"] == "attention")
    return {t["name"]: t["message"] for t in tests if t["outcome"] == "failed"}


def attention_failures(dists, impl: str) -> dict[str, str]:
    """The failed scenario cases of ``failed_cases``; the long-context and wide-range
    cases fail too, unlocated."""
    scenario_case = "test_attention_matches_the_reference["
    failures = failed_cases(dists, impl)
    return {name: message for name, message in failures.items() if name.startswith(scenario_case)}


def worst_element(message: str) -> re.Match[str]:
    """The worst element a message names; its got and expected values must differ visibly."""
    assert message.startswith("platform 'broken_attention': attention backend BROKEN ("), message
    assert "differs from the reference" in message, message
    match = WORST.search(message)
    assert match is not None, message
    got, expected = match.group(10), match.group(11)
    assert got != expected, message
    assert abs(float(got) - float(expected)) > 1e-3, message
    return match


def case_names(scenarios: list[str], min_group: int = 1) -> set[str]:
    """The names of the suite's reference cases for these scenarios, on every dtype and
    layout with at least ``min_group`` query heads per key/value head."""
    return {
        f"test_attention_matches_the_reference[{scenario}-{str(dtype).removeprefix('torch.')}-"
        f"{head_size}-{group}-{scale}]"
        for scenario in scenarios
        for dtype, head_size, group, scale in DTYPE_LAYOUTS
        if group >= min_group
    }


def test_a_backend_ignoring_the_layer_scale_fails_every_case(dists):
    failures = attention_failures(dists, IGNORES_SCALE)
    # Every case has a non-default scale; SDPA's default is right in none of them.
    assert set(failures) == case_names(list(SCENARIOS)), sorted(failures)
    for message in failures.values():
        worst_element(message)
        assert re.search(r"scale [\d.]+ \((0\.75|1\.25)/sqrt\((64|128)\)\)", message), message


def test_a_backend_expanding_gqa_with_repeat_fails_on_the_heads_it_mismatches(dists):
    failures = attention_failures(dists, GQA_WITH_REPEAT)
    # Caught on every layout sharing key/value heads, never on the one that does not.
    assert set(failures) == case_names(list(SCENARIOS), min_group=2), sorted(failures)
    for message in failures.values():
        match = worst_element(message)
        head, kv_head = int(match.group(7)), int(match.group(8))
        # The worst head is one that repeat pairs with the wrong key/value head (it
        # reads h % NUM_KV_HEADS), not head 0, which both expansions get right.
        assert kv_head != head % NUM_KV_HEADS, message


def test_a_top_left_causal_mask_fails_only_where_a_context_is_cached(dists):
    failures = attention_failures(dists, TOP_LEFT_CAUSAL_MASK)
    # The scenarios with a prefill after cached context; plain prefills and decodes pass.
    cached = ["chunked_prefill", "mixed", "cached_prefix"]
    assert set(failures) == case_names(cached), sorted(failures)
    for message in failures.values():
        match = worst_element(message)
        query_len, position, context_len = (int(match.group(i)) for i in (4, 5, 6))
        assert query_len > 1 and context_len > 0, message
        assert context_len <= position < context_len + query_len, message


def test_a_backend_keeping_one_layers_value_for_the_whole_step_fails_the_shared_step_case(dists):
    failures = failed_cases(dists, SCALE_KEPT_PER_STEP)
    # Every other case has one layer per step: the same backend passes them all.
    (message,) = failures.values()
    assert set(failures) == {"test_layers_sharing_a_step_each_match_the_reference"}
    # The first layer is right; the second, attending with the first's scale, is not.
    assert "layer 1 of 2 sharing the step" in message, message
    assert "scale 0.15625 (1.25/sqrt(64))" in message, message
    worst_element(message)
