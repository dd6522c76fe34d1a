"""The server's OpenAI request schemas, error bodies and event framing, without a server."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from slotwise_engine.server import sse
from slotwise_engine.server.errors import APIError, bad_request, model_not_found, queue_full
from slotwise_engine.server.protocol import ChatCompletionRequest, CompletionRequest


def test_completion_request_defaults_are_openai_s():
    request = CompletionRequest(model="m", prompt="hi")
    assert (request.max_tokens, request.temperature, request.top_p, request.n) == (16, 1.0, 1.0, 1)
    assert request.stream is False and request.unsupported() == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [("echo", True), ("logprobs", 2), ("best_of", 3), ("presence_penalty", 0.5),
     ("logit_bias", {"5": 1.0}), ("suffix", "x")],
)  # fmt: skip
def test_fields_the_server_does_not_implement_are_named(field, value):
    request = CompletionRequest(prompt="hi", **{field: value})
    assert list(request.unsupported()) == [field]


def test_chat_unsupported_fields_include_tools():
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=[{}])
    assert list(request.unsupported()) == ["tools"]


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError, match="nonsense"):
        CompletionRequest(prompt="hi", nonsense=1)


def test_prompt_may_be_text_ids_or_lists_of_them():
    for prompt in ("a", [1, 2], ["a"], [[1, 2]]):
        assert CompletionRequest(prompt=prompt).prompt == prompt
    with pytest.raises(ValidationError):
        CompletionRequest(prompt=[1.5])


def test_chat_messages_join_text_parts_for_the_template():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = ChatCompletionRequest(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]
    )
    assert [m.as_template_message() for m in request.messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
    ]
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=[])
    with pytest.raises(ValidationError):
        ChatCompletionRequest(
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
        )


def test_error_bodies_have_openai_s_four_fields():
    error = bad_request("top_p is 0", param="top_p")
    assert (error.status, error.body()) == (
        400,
        {"error": {"message": "top_p is 0", "type": "invalid_request_error", "param": "top_p",
                   "code": None}},
    )  # fmt: skip
    missing = model_not_found("gpt-4", "tiny")
    assert missing.status == 404 and missing.body()["error"]["code"] == "model_not_found"
    assert "tiny" in missing.message
    full = queue_full("too many")
    assert (full.status, full.body()["error"]["type"]) == (503, "server_error")
    assert isinstance(full, APIError)


def test_events_are_single_data_lines_ending_in_a_blank_line():
    payload = {"text": "line one\nline two", "emoji": "🙂"}
    event = sse.event(payload)
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert event.count("\n") == 2  # the newline in the text is escaped by JSON
    assert json.loads(event[len("data: ") :]) == payload
    assert sse.DONE == "data: [DONE]\n\n"
