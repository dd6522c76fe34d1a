"""``AsyncLLMEngine``: the ``LLMEngine`` for asyncio code, each request an async iterator.

One background task drives the engine: while any request is unfinished it runs
``engine.step()`` in a worker thread (so the event loop keeps serving, e.g. HTTP,
while the model runs) and hands each output to its request's queue.  Requests added
or aborted while a step runs are applied between two steps, from the event loop:
the engine is never touched by two threads at once.  Closing or cancelling a
request's iterator aborts it, and so does dropping it unread: a caller that awaited
``generate`` and then failed before reading would otherwise leave its request running
and its outputs piling up for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import Sequence

from slotwise_engine.serving.engine import EngineStats, LLMEngine
from slotwise_engine.serving.engine_request import EngineRequest
from slotwise_engine.serving.errors import QueueFullError, RequestError
from slotwise_engine.serving.outputs import RequestOutput
from slotwise_engine.serving.request_params import RequestParams

logger = logging.getLogger(__name__)

#: Requests waiting for a place in a step before ``generate`` refuses more.
DEFAULT_MAX_WAITING = 256


class AsyncLLMEngine:
    """Runs ``engine`` in the background for the event loop it is first used from.

    ``max_waiting``: how many requests may wait for a place in a step before
    ``generate`` raises ``QueueFullError``.
    """

    def __init__(self, engine: LLMEngine, *, max_waiting: int = DEFAULT_MAX_WAITING) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._to_add: list[EngineRequest] = []
        self._to_abort: list[str] = []
        self._stepping = False
        self._closed = False
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def generate(
        self, request_id: str, prompt: str | Sequence[int], params: RequestParams
    ) -> RequestStream:
        """The outputs of one request as its tokens come, the last one ``finished``.

        Raises ``RequestError`` for a request the engine refuses and ``QueueFullError``
        when ``max_waiting`` requests wait already, both before the first output.
        """
        if self._closed:
            raise QueueFullError("the engine is shutting down; send the request elsewhere")
        if request_id in self._queues:
            raise RequestError(f"request id {request_id!r} is in use; give each request its own")
        waiting = self.engine.stats().num_waiting + len(self._to_add)
        if waiting >= self.max_waiting:
            raise QueueFullError(
                f"{waiting} requests wait for the engine already (max_waiting "
                f"{self.max_waiting}); retry later"
            )
        request = self.engine.make_request(request_id, prompt, params)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._queues[request_id] = queue
        self._submit(request)
        return RequestStream(self, request_id, queue)

    def _release(self, request_id: str, *, abort: bool) -> None:
        """Forget a request's queue; abort the request unless it finished."""
        self._queues.pop(request_id, None)
        if abort:
            self.abort(request_id)

    def _abandoned(self, loop: asyncio.AbstractEventLoop, request_id: str) -> None:
        """A stream was garbage-collected unfinished, on whatever thread collected it."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs any more
            loop.call_soon_threadsafe(functools.partial(self._release, request_id, abort=True))

    def abort(self, request_id: str) -> None:
        """End a request; its iterator ends with an output of finish reason "abort"."""
        if self._stepping:
            self._to_abort.append(request_id)
        else:
            # Queued first if it came during a step, so its "abort" output comes too.
            self._apply_pending()
            self.engine.abort(request_id)
            self._wake_loop()

    def _submit(self, request: EngineRequest) -> None:
        if self._stepping:
            self._to_add.append(request)
        else:
            self.engine.enqueue(request)
        self._wake_loop()

    def _wake_loop(self) -> None:
        """Start the background task, or wake it to step the requests added."""
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def _apply_pending(self) -> None:
        """Requests added and aborted while a step ran, in the order they came."""
        to_add, self._to_add = self._to_add, []
        for request in to_add:
            self.engine.enqueue(request)
        to_abort, self._to_abort = self._to_abort, []
        for request_id in to_abort:
            self.engine.abort(request_id)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self._apply_pending()
            if not self.engine.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
                continue
            self._stepping = True
            try:
                outputs = await asyncio.to_thread(self.engine.step)
            except Exception as exc:  # noqa: BLE001 - the engine aborted every request; they get it
                logger.error("engine step failed; its requests end with the error: %s", exc)
                self._fail_all(exc)
                continue
            finally:
                self._stepping = False
            for output in outputs:
                queue = self._queues.get(output.request_id)
                if queue is not None:
                    queue.put_nowait(output)

    def _fail_all(self, exc: Exception) -> None:
        """End every request's iterator with ``exc``, those added during the step too."""
        self._to_add = []
        for queue in self._queues.values():
            queue.put_nowait(exc)

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new requests, let the running ones finish for up to ``grace_s``
        seconds, abort the rest and stop the background task."""
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self._busy() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for request_id in list(self._queues):
            self.abort(request_id)
        while self._busy():  # the aborted requests' last outputs reach their iterators
            await asyncio.sleep(0.01)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    def _busy(self) -> bool:
        return bool(
            self._stepping or self._to_add or self._to_abort or self.engine.has_unfinished()
        )


class RequestStream:
    """One request's outputs, an async iterator; ``aclose()``, a cancelled read or the
    stream dropped unread ends the request (finish reason "abort")."""

    def __init__(
        self,
        engine: AsyncLLMEngine,
        request_id: str,
        queue: asyncio.Queue[RequestOutput | BaseException],
    ) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue = queue
        self._ended = False
        self._on_drop = weakref.finalize(
            self, engine._abandoned, asyncio.get_running_loop(), request_id
        )

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._ended:
            raise StopAsyncIteration
        try:
            output = await self._queue.get()
        except BaseException:  # cancelled while waiting
            self._end(abort=True)
            raise
        if isinstance(output, BaseException):
            self._end(abort=True)
            raise output
        if output.finished:
            self._end(abort=False)
        return output

    async def aclose(self) -> None:
        """Stop reading: the request is aborted unless it finished."""
        self._end(abort=True)

    def _end(self, *, abort: bool) -> None:
        if not self._ended:
            self._ended = True
            self._on_drop.detach()
            self._engine._release(self.request_id, abort=abort)
