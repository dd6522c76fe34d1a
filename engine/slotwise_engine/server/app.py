"""The FastAPI application of ``slotwise serve``: OpenAI's routes over an asynchronous
engine, ``/health`` and ``/metrics``.

Each request turns into one engine request whose outputs the route reads as they come.
A route awaits the first output before it answers, so a request the engine refuses
(a bad prompt, a full queue) gets its error status even when it asked for a stream.
A client that goes away aborts its engine request: while the route waits (a watch on
the connection), and while it streams (Starlette stops the stream, whose cleanup
aborts).  The engine's abort is idempotent, so every exit path calls it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from slotwise_engine.models.errors import CheckpointError
from slotwise_engine.server import sse
from slotwise_engine.server.errors import (
    APIError,
    bad_request,
    engine_failed,
    model_not_found,
    not_found,
    queue_full,
    shutting_down,
)
from slotwise_engine.server.metrics import CONTENT_TYPE, EngineLoad, RequestTimer, ServerMetrics
from slotwise_engine.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    SamplingRequest,
    Usage,
)
from slotwise_engine.serving.async_engine import RequestStream
from slotwise_engine.serving.errors import QueueFullError, RequestError
from slotwise_engine.serving.outputs import RequestOutput
from slotwise_engine.serving.request_params import RequestParams

if TYPE_CHECKING:
    from slotwise_engine.models.tokenizer import Tokenizer


class EngineClient(Protocol):
    """What the server uses of :class:`~slotwise_engine.serving.async_engine.AsyncLLMEngine`."""

    async def generate(
        self, request_id: str, prompt: Sequence[int], params: RequestParams
    ) -> RequestStream: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineLoad: ...

    async def shutdown(self, grace_s: float) -> None: ...


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """The one model a server serves: its name in requests, tokenizer and context."""

    name: str
    tokenizer: Tokenizer
    max_model_len: int


class ClientDisconnected(Exception):
    """The client closed its connection before the answer was complete."""


def build_app(start_engine: Callable[[], EngineClient], model: ServedModel) -> FastAPI:
    """The application; ``start_engine`` builds the engine inside the server's event
    loop at start-up.  The HTTP server gives running requests their grace period on
    shutdown (http_server); what the application stops at its end is idle."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.engine = start_engine()
        try:
            yield
        finally:
            await app.state.engine.shutdown(0.0)

    app = FastAPI(title="slotwise", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.model = model
    app.state.metrics = ServerMetrics(model.name)
    #: Set when the server stops taking requests: new ones get a 503.
    app.state.draining = False
    _add_error_handlers(app)

    @app.get("/health")
    async def health(request: Request) -> Response:
        if request.app.state.draining:
            raise shutting_down()
        return PlainTextResponse("ok")

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        load = request.app.state.engine.stats()
        return PlainTextResponse(
            request.app.state.metrics.render(load), headers={"Content-Type": CONTENT_TYPE}
        )

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model.name, max_model_len=model.max_model_len)])

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        _check_request(body, model)
        prompt = await asyncio.to_thread(_completion_prompt, body.prompt, model.tokenizer)
        generation = _start(request, "cmpl", prompt, body, arrival)
        return await _answer(request, generation, body, _CompletionFormat(model.name))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        _check_request(body, model)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        messages = [message.as_template_message() for message in body.messages]
        prompt = await asyncio.to_thread(_chat_prompt, messages, model.tokenizer)
        generation = _start(request, "chatcmpl", prompt, body, arrival)
        return await _answer(request, generation, body, _ChatFormat(model.name))

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's format: the routes' own, a body FastAPI cannot parse or
    validate (400, naming the field), an unknown route (404)."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> Response:
        error = exc.errors()[0]
        if error.get("type") == "json_invalid":
            problem = error.get("ctx", {}).get("error", "")
            where = f" ({problem}, at character {error['loc'][-1]})" if problem else ""
            return await api_error(request, bad_request(f"the body is not valid JSON{where}"))
        where = [str(part) for part in error.get("loc", ()) if part != "body"]
        param = where[0] if where else None
        place = ".".join(where)
        message = f"{place}: {error.get('msg')}" if place else str(error.get("msg"))
        return await api_error(request, bad_request(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return await api_error(request, not_found(request.url.path))
        error = APIError(exc.status_code, str(exc.detail), code=None)
        return await api_error(request, error)


def _check_request(body: SamplingRequest, model: ServedModel) -> None:
    if body.model is not None and body.model != model.name:
        raise model_not_found(body.model, model.name)
    unsupported = body.unsupported()
    if unsupported:
        name, default = next(iter(unsupported.items()))
        raise bad_request(
            f"{name} is not supported by slotwise serve; leave it out (default {default!r})",
            param=name,
        )
    if body.n != 1:
        raise bad_request(f"n is {body.n}; slotwise serve returns one choice (n=1)", param="n")
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only allowed with stream=true", param="stream_options")


def _completion_prompt(prompt: Any, tokenizer: Tokenizer) -> list[int]:
    """The token ids of a completion's prompt: text (encoded as ``slotwise generate``
    does, special tokens added) or ids; a list of one prompt counts as that prompt."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise bad_request(
                f"prompt holds {len(prompt)} prompts; send one prompt per request", param="prompt"
            )
        prompt = prompt[0]
    if not prompt:
        raise bad_request("prompt is empty; send text or token ids", param="prompt")
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    return list(prompt)


def _chat_prompt(messages: list[dict[str, str]], tokenizer: Tokenizer) -> list[int]:
    """The token ids of ``messages`` rendered by the checkpoint's chat template (which
    writes the special tokens itself), ready for the assistant's answer."""
    if tokenizer.chat_template is None:
        raise bad_request("this model has no chat template; use /v1/completions", param="messages")
    try:
        rendered = tokenizer.apply_chat_template(messages)
    except CheckpointError as exc:
        message = f"the chat template refused the messages: {exc}"
        raise bad_request(message, param="messages") from exc
    return tokenizer.encode(rendered, add_special_tokens=False)


def _params(body: SamplingRequest, prompt_tokens: int, max_model_len: int) -> RequestParams:
    max_tokens = body.max_tokens
    if max_tokens is None:  # as many as the context leaves
        max_tokens = max(max_model_len - prompt_tokens, 1)
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    try:
        return RequestParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            seed=body.seed,
            stop=stop,
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
        )
    except ValueError as exc:
        field = str(exc).split(" ", 1)[0]  # RequestParams' messages start with the field
        param = field if field in type(body).model_fields else None
        raise bad_request(str(exc), param=param) from exc


class Generation:
    """One engine request as a route reads it: its outputs, its metrics, and an abort
    on every way out."""

    def __init__(
        self, engine: EngineClient, request_id: str, prompt: list[int], params: RequestParams,
        timer: RequestTimer,
    ) -> None:  # fmt: skip
        self.engine = engine
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.outputs: RequestStream | None = None
        self.timer = timer
        self.done = False

    async def next(self) -> RequestOutput:
        """The next output; a refusal of the engine as the API error it means."""
        try:
            if self.outputs is None:  # the engine checks the request here
                self.outputs = await self.engine.generate(self.request_id, self.prompt, self.params)
            output = await self.outputs.__anext__()
        except StopAsyncIteration:
            self.done = True
            raise shutting_down() from None
        except QueueFullError as exc:
            self.done = True
            raise queue_full(str(exc)) from exc
        except RequestError as exc:
            self.done = True
            raise bad_request(str(exc), param="prompt") from exc
        except Exception as exc:  # a failed engine step ended the request
            self.done = True
            self.timer.close("error")
            raise engine_failed(exc) from exc
        self.timer.admitted(len(output.prompt_token_ids))
        self.timer.tokens(len(output.new_token_ids))
        if output.finished:
            self.done = True
            self.timer.close(output.finish_reason or "abort")
        return output

    async def close(self) -> None:
        """Abort the request unless it finished; safe to call more than once, and from a
        cancelled task (the iterator's closing is shielded)."""
        if self.done:
            return
        self.done = True
        self.timer.close("abort")
        self.engine.abort(self.request_id)
        if self.outputs is not None:
            with anyio.CancelScope(shield=True):
                await self.outputs.aclose()


def _start(
    request: Request, prefix: str, prompt: list[int], body: SamplingRequest, arrival: float
) -> Generation:
    state = request.app.state
    if state.draining:
        raise shutting_down()
    params = _params(body, len(prompt), state.model.max_model_len)
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    return Generation(state.engine, request_id, prompt, params, state.metrics.track(arrival))


async def _answer(
    request: Request, generation: Generation, body: SamplingRequest, format: _Format
) -> Response:
    """The whole answer, or a stream of chunks; the engine request is aborted unless
    it finished or the stream took it over."""
    streaming = False
    try:
        first = await _unless_disconnected(request, generation.next())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = _events(generation, first, format, include_usage=include_usage)
            streaming = True
            return _EventStream(events, on_close=generation.close)
        output = first
        if not output.finished:
            output = await _unless_disconnected(request, _last(generation))
        if output.finish_reason == "abort":
            raise shutting_down()
        return JSONResponse(format.whole(generation.request_id, output))
    except ClientDisconnected:
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
    finally:
        if not streaming:
            await generation.close()


async def _last(generation: Generation) -> RequestOutput:
    while True:
        output = await generation.next()
        if output.finished:
            return output


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """``work``'s result, or ClientDisconnected (``work`` cancelled) if the client closes
    the connection first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected
    return task.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body is read: nothing else can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _EventStream(StreamingResponse):
    """Server-sent events that run ``on_close`` however the response ends: complete,
    its client gone, or the server cancelling it at shutdown."""

    def __init__(self, events: AsyncIterator[str], *, on_close: Callable[[], Any]) -> None:
        super().__init__(events, media_type=sse.MEDIA_TYPE, headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.on_close()


async def _events(
    generation: Generation, first: RequestOutput, format: _Format, *, include_usage: bool
) -> AsyncIterator[str]:
    request_id = generation.request_id
    for chunk in format.opening(request_id):
        yield sse.event(chunk)
    output = first
    while True:
        for chunk in format.chunks(request_id, output):
            yield sse.event(chunk)
        if output.finished:
            break
        try:
            output = await generation.next()
        except APIError as exc:  # the status is sent: the error goes in the stream
            yield sse.event(exc.body())
            yield sse.DONE
            return
    if include_usage:
        yield sse.event(format.usage_chunk(request_id, output))
    yield sse.DONE


def _usage(output: RequestOutput) -> Usage:
    return Usage.of(len(output.prompt_token_ids), len(output.token_ids))


class _Format:
    """How one API shapes a finished request and the chunks of a streamed one."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def whole(self, request_id: str, output: RequestOutput) -> dict[str, Any]:
        raise NotImplementedError

    def opening(self, request_id: str) -> list[dict[str, Any]]:
        return []

    def chunks(self, request_id: str, output: RequestOutput) -> list[dict[str, Any]]:
        raise NotImplementedError

    def usage_chunk(self, request_id: str, output: RequestOutput) -> dict[str, Any]:
        raise NotImplementedError


class _CompletionFormat(_Format):
    def whole(self, request_id: str, output: RequestOutput) -> dict[str, Any]:
        choice = CompletionChoice(text=output.text, finish_reason=output.finish_reason)
        response = CompletionResponse(
            id=request_id, model=self.model_name, choices=[choice], usage=_usage(output)
        )
        return response.model_dump()

    def chunks(self, request_id: str, output: RequestOutput) -> list[dict[str, Any]]:
        if not output.new_text and not output.finished:
            return []
        choice = CompletionChoice(text=output.new_text, finish_reason=output.finish_reason)
        chunk = CompletionResponse(id=request_id, model=self.model_name, choices=[choice])
        return [chunk.model_dump(exclude={"usage"})]

    def usage_chunk(self, request_id: str, output: RequestOutput) -> dict[str, Any]:
        chunk = CompletionResponse(
            id=request_id, model=self.model_name, choices=[], usage=_usage(output)
        )
        return chunk.model_dump()


class _ChatFormat(_Format):
    def whole(self, request_id: str, output: RequestOutput) -> dict[str, Any]:
        choice = ChatChoice(
            message=AssistantMessage(content=output.text), finish_reason=output.finish_reason
        )
        response = ChatCompletionResponse(
            id=request_id, model=self.model_name, choices=[choice], usage=_usage(output)
        )
        return response.model_dump()

    def _chunk(self, request_id: str, delta: ChatDelta, finish: str | None) -> dict[str, Any]:
        choice = ChatChunkChoice(delta=delta, finish_reason=finish)
        chunk = ChatCompletionChunk(id=request_id, model=self.model_name, choices=[choice])
        data = chunk.model_dump(exclude={"usage"})
        data["choices"][0]["delta"] = delta.model_dump(exclude_none=True)  # as OpenAI sends it
        return data

    def opening(self, request_id: str) -> list[dict[str, Any]]:
        return [self._chunk(request_id, ChatDelta(role="assistant", content=""), None)]

    def chunks(self, request_id: str, output: RequestOutput) -> list[dict[str, Any]]:
        chunks = []
        if output.new_text:
            chunks.append(self._chunk(request_id, ChatDelta(content=output.new_text), None))
        if output.finished:
            chunks.append(self._chunk(request_id, ChatDelta(), output.finish_reason))
        return chunks

    def usage_chunk(self, request_id: str, output: RequestOutput) -> dict[str, Any]:
        chunk = ChatCompletionChunk(
            id=request_id, model=self.model_name, choices=[], usage=_usage(output)
        )
        return chunk.model_dump()
