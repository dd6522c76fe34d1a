"""``slotwise serve`` through the official ``openai`` client, on one server for the file.

The server runs at level 3 (eager backend: piecewise graphs for mixed steps) with a KV
cache of 12 blocks (192 tokens) for at most 8 requests of at most 32 tokens a step,
so concurrent requests are prefilled in chunks beside decodes and preempt each other.
``slotwise generate`` at level 0 (eager) is the oracle of its greedy tokens.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest
from serve_process import ServeProcess, start_serve

pytestmark = pytest.mark.slow

PROMPTS = ["Hello world, the quick fox", "Grüße aus Köln 日本語 🙂", "Ça va ? Très bien"]
N = 24
KV_BLOCKS = 12
WORDS = "the quick brown fox jumps over lazy dog sunny day Köln Straße gare 東京 tokens".split()


@pytest.fixture(scope="module")
def server(
    tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    server = start_serve(
        tiny_checkpoint, log,
        "--num-kv-blocks", str(KV_BLOCKS), "--max-num-seqs", "8",
        "--max-num-batched-tokens", "32", "-O3", "-O.backend=eager",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return server.client()


def generate_json(folder: Path, prompts: list[str], *options: str) -> list[dict]:
    """``slotwise generate --json`` at level 0 in a subprocess: one object per prompt."""
    prompt_args = [arg for prompt in prompts for arg in ("--prompt", prompt)]
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "generate", "--model", str(folder), *prompt_args,
         "--max-new-tokens", str(N), "--ignore-eos", "--json", "-O0", *options],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def oracle(tiny_checkpoint: Path) -> list[dict]:
    """``slotwise generate``'s greedy answers to PROMPTS."""
    return generate_json(tiny_checkpoint, PROMPTS)


def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert [model.id for model in models] == ["tiny"]


def test_greedy_completions_equal_slotwise_generate(client, oracle):
    for prompt, expected in zip(PROMPTS, oracle, strict=True):
        completion = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=N, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        choice = completion.choices[0]
        assert choice.text == expected["text"]
        assert choice.finish_reason == "length"
        assert completion.usage.prompt_tokens == len(expected["prompt_token_ids"])
        assert completion.usage.completion_tokens == N
        assert completion.usage.total_tokens == len(expected["prompt_token_ids"]) + N
        by_ids = client.completions.create(
            model="tiny", prompt=expected["prompt_token_ids"], max_tokens=N, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert by_ids.choices[0].text == expected["text"]


def test_a_stop_string_ends_the_text_before_it(client, oracle):
    text = oracle[0]["text"]
    cut = next(
        i for i, char in enumerate(text)
        if i > 0 and char.isascii() and char.isalpha() and char not in text[:i]
    )  # fmt: skip
    completion = client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=N, temperature=0, stop=text[cut],
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert completion.choices[0].text == text[:cut]
    assert completion.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats_streamed_or_not(client):
    options = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": N, "temperature": 0.9,
               "seed": 3, "extra_body": {"top_k": 20, "ignore_eos": True}}  # fmt: skip
    first = client.completions.create(**options).choices[0].text
    assert client.completions.create(**options).choices[0].text == first
    chunks = client.completions.create(stream=True, **options)
    assert "".join(chunk.choices[0].text for chunk in chunks) == first
    greedy = client.completions.create(**{**options, "temperature": 0}).choices[0].text
    assert first != greedy  # the parameters reached the sampler


def test_greedy_chat_equals_slotwise_generate_chat(client, tiny_checkpoint):
    expected = generate_json(tiny_checkpoint, PROMPTS[:2], "--chat")
    for prompt, oracle in zip(PROMPTS, expected, strict=False):
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=N,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert chat.choices[0].message.role == "assistant"
        assert chat.choices[0].message.content == oracle["text"]
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage.prompt_tokens == len(oracle["prompt_token_ids"])
        assert chat.usage.completion_tokens == N


def test_streamed_equals_not_streamed(client):
    options = {"model": "tiny", "max_tokens": N, "temperature": 0}
    for prompt in PROMPTS:
        whole = client.completions.create(prompt=prompt, **options)
        chunks = list(
            client.completions.create(
                prompt=prompt, stream=True, stream_options={"include_usage": True}, **options
            )
        )
        text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
        finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
        assert text == whole.choices[0].text
        assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) <= {None}
        assert chunks[-1].usage == whole.usage and not chunks[-1].choices

        messages = [{"role": "user", "content": prompt}]
        whole_chat = client.chat.completions.create(messages=messages, **options)
        streamed = client.chat.completions.create(messages=messages, stream=True, **options)
        chat_chunks = list(streamed)
        assert chat_chunks[0].choices[0].delta.role == "assistant"
        content = "".join(c.choices[0].delta.content or "" for c in chat_chunks)
        assert content == whole_chat.choices[0].message.content
        assert chat_chunks[-1].choices[0].finish_reason == whole_chat.choices[0].finish_reason


def random_prompts(count: int, seed: int) -> list[str]:
    """Prompts of 1 to 16 words (about 5 to 70 tokens): some prefill in one step,
    others over several."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 16))) for _ in range(count)]


def test_concurrent_streams_equal_each_prompt_alone_with_preemption(server, client):
    prompts = random_prompts(32, seed=53)
    options = {"model": "tiny", "max_tokens": N, "temperature": 0}
    options["extra_body"] = {"ignore_eos": True}
    alone = [client.completions.create(prompt=p, **options).choices[0].text for p in prompts]
    preemptions_before = server.metric("slotwise_num_preemptions_total")
    texts: list[str | None] = [None] * len(prompts)
    failures: list[BaseException] = []
    delays = random.Random(7).sample([i * 0.02 for i in range(len(prompts))], len(prompts))

    def stream(index: int) -> None:
        try:
            time.sleep(delays[index])  # arrivals spread over 0.6 s, in random order
            with server.client() as own:
                chunks = own.completions.create(prompt=prompts[index], stream=True, **options)
                texts[index] = "".join(chunk.choices[0].text for chunk in chunks)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures, failures
    assert texts == alone
    assert server.metric("slotwise_num_preemptions_total") > preemptions_before
    server.wait_idle()


def test_disconnected_clients_abort_and_free_their_blocks(server, client):
    def aborted() -> float:
        return server.metric("slotwise_requests_finished_total", finished_reason="abort")

    before = aborted()
    options = {"model": "tiny", "max_tokens": 180, "temperature": 0}
    # A stream closed after its first chunks.
    stream = client.completions.create(
        prompt="Hello world", stream=True, extra_body={"ignore_eos": True}, **options
    )
    chunks = iter(stream)
    next(chunks)
    next(chunks)
    stream.close()
    server.wait_idle()
    assert aborted() == before + 1
    # A request whose client goes away, once it runs, before the answer.
    body = json.dumps({"prompt": "Hello there", "ignore_eos": True, **options}).encode()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    generated = server.metric("slotwise_generation_tokens_total")
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 60
        while server.metric("slotwise_generation_tokens_total") == generated:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.005)
    server.wait_idle()
    assert aborted() == before + 2


def status_and_error(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value.status_code, caught.value.response.json()["error"]


@pytest.mark.parametrize(
    ("options", "param", "words"),
    [
        ({"n": 2}, "n", "n=1"),
        ({"temperature": -1}, "temperature", ">= 0"),
        ({"top_p": 0}, "top_p", "(0, 1]"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        ({"extra_body": {"top_k": -2}}, "top_k", ">= 0"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": []}, "prompt", "empty"),
        ({"prompt": [300]}, "prompt", "vocabulary"),
        ({"prompt": [5] * 190}, "prompt", "shorten the prompt"),
        ({"prompt": ["one", "two"]}, "prompt", "one prompt per request"),
        ({"logprobs": 2}, "logprobs", "not supported"),
        ({"extra_body": {"colour": "red"}}, "colour", "Extra inputs"),
        ({"extra_body": {"stop_token_ids": [-1]}}, "stop_token_ids", "token id"),
    ],
    ids=lambda value: json.dumps(value)[:40] if isinstance(value, dict) else None,
)
def test_bad_completion_requests_are_400_in_openai_s_format(server, client, options, param, words):
    request = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, **options}
    status, error = status_and_error(lambda: client.completions.create(**request))
    assert status == 400
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_other_errors_and_the_server_keeps_serving(server, client):
    status, error = status_and_error(
        lambda: client.completions.create(model="gpt-4", prompt="Hello", max_tokens=2)
    )
    assert (status, error["code"], error["param"]) == (404, "model_not_found", "model")
    status, error = status_and_error(
        lambda: client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    )
    assert (status, error["param"]) == (400, "messages")
    status, error = status_and_error(
        lambda: client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], n=3
        )
    )
    assert (status, error["param"]) == (400, "n")
    response = httpx2.post(
        f"{server.url}/v1/completions", content=b'{"prompt": ', timeout=30,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]
    response = httpx2.get(f"{server.url}/v2/nothing", timeout=30)
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    completion = client.completions.create(model="tiny", prompt="Hello", max_tokens=3)
    assert completion.usage.completion_tokens <= 3
    server.wait_idle()
