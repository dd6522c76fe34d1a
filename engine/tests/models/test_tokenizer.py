"""slotwise's Tokenizer against transformers' AutoTokenizer on the same folder: the same
ids, the same text, the same chat prompts; and streaming that never breaks a character."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import transformers
from hf_tokenizers import STYLES, make_tokenizer

from slotwise_engine.models import CheckpointError
from slotwise_engine.models.model_files import TEMPLATE_LIMIT
from slotwise_engine.models.tokenizer import Tokenizer

VOCAB = {"llama3": 300, "qwen2": 300, "mistral": 400}
TEXTS = [
    "Hello world",
    " leading and  double  spaces ",
    "Grüße aus Köln! Ça va ? 日本語のテキスト 🙂",
    "special tokens in text: <|eot_id|><s></s><|im_end|> end",
    "line\nbreaks\n\n and\ttabs",
    "",
]
CHAT = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Wie heißt die Hauptstadt? 日本"},
    {"role": "assistant", "content": "Tokio."},
    {"role": "user", "content": "Und jetzt? 🙂"},
]


@pytest.fixture(scope="module", params=sorted(STYLES))
def style(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def folder(style, tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp(style), style, vocab_size=VOCAB[style])


@pytest.fixture(scope="module")
def ours(folder) -> Tokenizer:
    return Tokenizer.load(folder)


@pytest.fixture(scope="module")
def theirs(folder) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(folder)


def random_ids(vocab_size: int, seed: int, length: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _ in range(length)]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(ours, theirs, text):
    assert ours.encode(text) == theirs(text)["input_ids"]
    assert (
        ours.encode(text, add_special_tokens=False)
        == theirs(text, add_special_tokens=False)["input_ids"]
    )


def test_bos_is_added_as_each_family_does(ours, style):
    bos = STYLES[style][1]
    ids = ours.encode("Hello")
    if bos is None:
        assert ids == ours.encode("Hello", add_special_tokens=False)
    else:
        assert ids == [
            ours.backend.token_to_id(bos),
            *ours.encode("Hello", add_special_tokens=False),
        ]


def test_decode_matches_transformers_on_any_ids(ours, theirs):
    assert ours.vocab_size == len(theirs)
    for seed in range(20):
        ids = random_ids(ours.vocab_size, seed)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def stream(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    decoder = tokenizer.stream()
    return [decoder.push(i) for i in ids] + [decoder.flush()]


def test_streamed_pieces_join_to_the_decoded_text(ours, style):
    # Any ids, invalid UTF-8 included, for byte-level BPE (lossy decoding of the bytes
    # is settled at every character end).  SentencePiece's byte fallback decodes a run
    # of byte tokens that is not valid UTF-8 as a whole, so that only valid text streams
    # exactly; a trained model writes valid text.
    for seed in range(20 if style != "mistral" else 0):
        ids = random_ids(ours.vocab_size, seed)
        assert "".join(stream(ours, ids)) == ours.decode(ids)
    for text in TEXTS:
        ids = ours.encode(text)
        pieces = stream(ours, ids)
        assert "".join(pieces) == ours.decode(ids)
        assert not any("\ufffd" in piece for piece in pieces)
        # Released text is final: every prefix of the stream is a prefix of the text.
        for end in range(len(pieces)):
            assert ours.decode(ids).startswith("".join(pieces[:end]))


def test_a_character_split_over_tokens_is_released_whole(ours):
    ids = ours.encode("日本🙂", add_special_tokens=False)
    assert len(ids) > 3  # the characters are split, else this test proves nothing
    pieces = [piece for piece in stream(ours, ids) if piece]
    assert pieces == ["日", "本", "🙂"]


def test_chat_template_matches_transformers(ours, theirs, style):
    messages = CHAT[1:] if style == "mistral" else CHAT  # no system role there
    text = ours.apply_chat_template(messages)
    assert text == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = theirs.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == expected


def test_a_template_refusing_a_conversation_names_the_reason(tmp_path):
    tokenizer = Tokenizer.load(make_tokenizer(tmp_path, "mistral", vocab_size=400))
    with pytest.raises(CheckpointError, match="roles must alternate user/assistant"):
        tokenizer.apply_chat_template([CHAT[1], CHAT[1]])


def test_templates_run_sandboxed(tmp_path):
    folder = make_tokenizer(tmp_path, "qwen2")
    (folder / "chat_template.jinja").write_text("{{ messages.append(1) }}")
    with pytest.raises(CheckpointError, match="the chat template failed"):
        Tokenizer.load(folder).apply_chat_template(CHAT)


def test_chat_template_jinja_file_wins_over_the_config(tmp_path):
    folder = make_tokenizer(tmp_path, "qwen2")
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert Tokenizer.load(folder).apply_chat_template(CHAT) == CHAT[0]["content"] + "!"


def test_end_ids_come_from_generation_config_else_the_eos_token(tmp_path):
    llama3 = Tokenizer.load(make_tokenizer(tmp_path / "l", "llama3"))
    end_ids = [llama3.backend.token_to_id(t) for t in ("<|end_of_text|>", "<|eot_id|>")]
    assert llama3.eos_token_ids == tuple(end_ids)
    qwen = Tokenizer.load(make_tokenizer(tmp_path / "q", "qwen2"))
    assert qwen.eos_token_ids == (qwen.backend.token_to_id("<|im_end|>"),)
    (tmp_path / "q" / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert Tokenizer.load(tmp_path / "q").eos_token_ids == (7,)


def test_a_missing_tokenizer_json_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: missing"):
        Tokenizer.load(tmp_path)


def test_no_chat_template_is_a_clear_error(tmp_path):
    folder = make_tokenizer(tmp_path, "qwen2")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="no chat template"):
        Tokenizer.load(folder).apply_chat_template(CHAT)


def test_a_chat_template_in_the_config_over_the_limit_is_refused(tmp_path):
    folder = make_tokenizer(tmp_path, "qwen2")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "x" * (TEMPLATE_LIMIT + 1)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"tokenizer_config\.json \(chat_template\): 1,048,577"
    ):
        Tokenizer.load(folder)


def test_a_tokenizer_json_that_is_not_utf8_is_named(tmp_path):
    folder = make_tokenizer(tmp_path, "qwen2")
    (folder / "tokenizer.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: not UTF-8 text"):
        Tokenizer.load(folder)
