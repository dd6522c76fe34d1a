"""AsyncLLMEngine: concurrent requests as async iterators, each as if alone; cancelling
one aborts it and returns its blocks; a full queue is refused; shutdown ends the rest."""

from __future__ import annotations

import asyncio

import pytest
from serving_support import run_alone, tiny_runner

from slotwise_engine.serving.async_engine import AsyncLLMEngine
from slotwise_engine.serving.engine import LLMEngine
from slotwise_engine.serving.errors import QueueFullError, RequestError
from slotwise_engine.serving.request_params import RequestParams

PROMPTS = {"a": [1, 2, 3], "b": [5], "c": [42, 11, 100, 3, 4, 5, 6, 7, 8, 9]}
PARAMS = RequestParams(max_tokens=8, ignore_eos=True)


async def collect(engine: AsyncLLMEngine, request_id: str, prompt: list[int]) -> list[int]:
    tokens = []
    async for output in await engine.generate(request_id, prompt, PARAMS):
        tokens += output.new_token_ids
    assert output.finished and output.token_ids == tokens
    return tokens


def test_concurrent_requests_stream_their_own_tokens_and_a_cancelled_one_is_aborted():
    async def main() -> None:
        engine = AsyncLLMEngine(LLMEngine(tiny_runner(), max_num_batched_tokens=8))
        seen: list[str] = []

        async def cancelled() -> None:
            params = RequestParams(max_tokens=200, ignore_eos=True)
            async for output in await engine.generate("x", [9, 9, 9], params):
                seen.append(output.finish_reason or "")

        victim = asyncio.create_task(cancelled())
        results = await asyncio.gather(*(collect(engine, k, p) for k, p in PROMPTS.items()))
        assert not victim.done()  # 200 tokens: it is still running
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        for _ in range(100):
            await asyncio.sleep(0.01)
            if engine.stats().kv_blocks_used == 0:
                break
        assert engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0
        assert len(seen) < 200
        assert results == [run_alone(p, PARAMS) for p in PROMPTS.values()]
        await engine.shutdown(grace_s=1.0)

    asyncio.run(main())


def test_bad_requests_and_a_full_queue_are_refused_before_the_first_output():
    async def main() -> None:
        engine = AsyncLLMEngine(LLMEngine(tiny_runner()), max_waiting=1)
        with pytest.raises(RequestError, match="the prompt is empty"):
            await engine.generate("e", [], PARAMS)
        first = await engine.generate("1", [1, 2], PARAMS)
        with pytest.raises(QueueFullError, match="max_waiting 1"):
            await engine.generate("2", [1, 2], PARAMS)
        assert len([o async for o in first]) == 8
        await engine.shutdown(grace_s=1.0)

    asyncio.run(main())


def test_shutdown_aborts_what_outlasts_the_grace_period():
    async def main() -> None:
        engine = AsyncLLMEngine(LLMEngine(tiny_runner()))
        outputs = await engine.generate("long", [1], RequestParams(max_tokens=200, ignore_eos=True))
        await engine.shutdown(grace_s=0.05)
        received = [o async for o in outputs]
        assert received[-1].finish_reason == "abort" and len(received) < 200
        assert engine.stats().kv_blocks_used == 0
        with pytest.raises(QueueFullError, match="shutting down"):
            await engine.generate("late", [1], PARAMS)

    asyncio.run(main())


def test_a_stream_dropped_or_closed_unread_aborts_its_request_and_frees_its_blocks():
    async def main() -> None:
        inner = LLMEngine(tiny_runner())
        aborted: list[str] = []
        abort = inner.abort
        inner.abort = lambda request_id: (aborted.append(request_id), abort(request_id))
        engine = AsyncLLMEngine(inner)
        long = RequestParams(max_tokens=200, ignore_eos=True)
        await engine.generate("dropped", [1, 2], long)  # the caller failed before reading
        closed = await engine.generate("closed", [3, 4], long)
        await closed.aclose()
        assert [o async for o in closed] == []
        for _ in range(200):
            await asyncio.sleep(0.01)
            stats = engine.stats()
            if stats.kv_blocks_used == 0 and stats.num_running + stats.num_waiting == 0:
                break
        assert engine.stats().kv_blocks_used == 0
        assert engine.stats().num_running + engine.stats().num_waiting == 0
        assert sorted(aborted) == ["closed", "dropped"]
        assert engine._queues == {}  # nothing kept for a reader that will never come
        # The engine serves the next request as if alone.
        assert await collect(engine, "next", PROMPTS["a"]) == run_alone(PROMPTS["a"], PARAMS)
        await engine.shutdown(grace_s=1.0)

    asyncio.run(main())
