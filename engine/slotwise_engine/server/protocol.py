"""OpenAI's request and response bodies for the routes ``slotwise serve`` offers.

Requests accept OpenAI's fields plus vLLM's sampling extensions (``top_k``,
``stop_token_ids``, ``ignore_eos``); a field the server does not implement is refused
with a 400 when set to anything but its default, and an unknown field is refused too,
so nothing a client asks for is silently ignored.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Send one more chunk before ``[DONE]``, with no choices and the usage.
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """The fields both generation routes share: the model, sampling and stopping,
    streaming."""

    model_config = ConfigDict(extra="forbid")

    #: The served model's name; omitted, the one model this server serves.
    model: str | None = None
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None
    # OpenAI's fields the server does not implement: refused unless at their default.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> dict[str, Any]:
        """The fields set to something the server does not implement, with the default
        each would need."""
        return {
            name: default
            for name, default in self._unsupported_defaults().items()
            if getattr(self, name) != default
        }

    def _unsupported_defaults(self) -> dict[str, Any]:
        return {"presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": None}


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: one prompt, text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def _unsupported_defaults(self) -> dict[str, Any]:
        return {
            **super()._unsupported_defaults(),
            "echo": False,
            "logprobs": None,
            "best_of": None,
            "suffix": None,
        }


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str
    #: Text, or a list of text parts (joined); images and audio are not supported.
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        """The message as chat templates read it: role and content text."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``: messages rendered by the checkpoint's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    #: OpenAI's newer name for max_tokens; wins where both are given.
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: Any = None

    def _unsupported_defaults(self) -> dict[str, Any]:
        return {
            **super()._unsupported_defaults(),
            "logprobs": False,
            "top_logprobs": None,
            "tools": None,
            "tool_choice": None,
            "response_format": None,
        }


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    """The body of a completion, and (``choices`` holding the new text) of each chunk
    of a streamed one."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "slotwise"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
