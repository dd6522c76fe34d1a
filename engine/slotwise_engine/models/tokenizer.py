"""The tokenizer of a Hugging Face checkpoint folder, read with the ``tokenizers`` library.

transformers is not needed at run time: tokenizer.json holds the whole pipeline
(normalizer, pre-tokenizer, model, decoder) and the post-processor that adds the
special tokens of each model family (``<|begin_of_text|>`` for Llama 3, ``<s>`` for
Llama 2 and Mistral, nothing for Qwen).  Like transformers 5, slotwise takes that
post-processor as it is and ignores tokenizer_config.json's ``add_bos_token`` and
``add_eos_token`` whenever tokenizer.json exists.  tokenizer_config.json adds the
names of the special tokens and the chat template; generation_config.json the ids
generation stops at.

Every file is read through :mod:`slotwise_engine.models.model_files` (a regular file of the
model, within a size limit) and the chat template is rendered by
:mod:`slotwise_engine.models.chat_template` (sandboxed and bounded).  Importing this module
imports ``tokenizers`` and ``jinja2`` (not torch): the CLI imports it inside its
commands only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from slotwise_engine.models.chat_template import render_chat_template
from slotwise_engine.models.errors import CheckpointError
from slotwise_engine.models.model_files import (
    JSON_LIMIT,
    TEMPLATE_LIMIT,
    TOKENIZER_LIMIT,
    model_file_exists,
    read_model_file,
    read_model_json,
)

#: One message of a chat: {"role": "user", "content": "..."}.
Message = Mapping[str, Any]


class Tokenizer:
    """Text to token ids and back, with the special tokens and chat template of one
    checkpoint.  Build it with :meth:`load`."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        eos_token_ids: Sequence[int] = (),
        chat_template: str | None = None,
        chat_template_origin: str | None = None,
        source: Path | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        #: The ids generation stops at: generation_config.json's ``eos_token_id`` (one id
        #: or a list: instruct models end a turn with another token than a document),
        #: else the id of tokenizer_config.json's ``eos_token``.
        self.eos_token_ids = tuple(eos_token_ids)
        self.chat_template = chat_template
        #: Where the chat template was read, as errors name it.
        self.chat_template_origin = chat_template_origin or f"{source} (chat template)"
        self.source = source

    @classmethod
    def load(cls, folder: str | Path) -> Tokenizer:
        """The tokenizer saved in ``folder`` (tokenizer.json, and tokenizer_config.json,
        generation_config.json and chat_template.jinja where present)."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not model_file_exists(folder, "tokenizer.json"):
            raise CheckpointError(
                f"{path}: missing; slotwise reads the tokenizer from tokenizer.json, the file "
                "transformers' fast tokenizers save (save_pretrained writes it)"
            )
        text = _read_text(folder, "tokenizer.json", TOKENIZER_LIMIT)
        try:
            backend = tokenizers.Tokenizer.from_str(text)
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise CheckpointError(f"{path}: not a tokenizers file ({exc})") from exc
        config = _read_json(folder, "tokenizer_config.json")
        generation = _read_json(folder, "generation_config.json")
        bos_token = _token_text(config.get("bos_token"))
        eos_token = _token_text(config.get("eos_token"))
        eos_ids = _ids(generation.get("eos_token_id"), folder / "generation_config.json")
        if not eos_ids and eos_token is not None:
            eos_id = backend.token_to_id(eos_token)
            eos_ids = () if eos_id is None else (eos_id,)
        template, origin = _chat_template(folder, config)
        return cls(
            backend,
            bos_token=bos_token,
            eos_token=eos_token,
            eos_token_ids=eos_ids,
            chat_template=template,
            chat_template_origin=origin,
            source=folder,
        )

    @property
    def vocab_size(self) -> int:
        """Ids run from 0 to ``vocab_size - 1``, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``; special tokens written in it (``<|eot_id|>``) are parsed
        as those tokens, and ``add_special_tokens`` runs the post-processor."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` without special tokens."""
        return self.backend.decode(list(token_ids), skip_special_tokens=True)

    def stream(self) -> StreamDecoder:
        """A decoder for tokens that arrive one at a time."""
        return StreamDecoder(self)

    def apply_chat_template(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True
    ) -> str:
        """``messages`` rendered by the checkpoint's chat template, ending with the start
        of the assistant's turn.  Encode the result with ``add_special_tokens=False``:
        templates write the BOS token themselves.  Any failure of the template, or a
        rendering past its bounds (see :mod:`slotwise_engine.models.chat_template`), is one
        CheckpointError naming the template."""
        if self.chat_template is None:
            raise CheckpointError(
                f"{self.source}: no chat template (neither chat_template.jinja nor a "
                "'chat_template' in tokenizer_config.json); prompt the model without --chat"
            )
        variables = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }
        return render_chat_template(self.chat_template, self.chat_template_origin, variables)


class StreamDecoder:
    """Turns token ids arriving one by one into text, releasing only complete text.

    Byte-level tokens can end inside a UTF-8 character (``日`` is three bytes), where
    decoding gives U+FFFD; so text is held back while it ends in one.  Each new piece
    is the difference between decoding a window that starts at the last released
    piece with and without the new tokens: decoders that strip the first space
    (SentencePiece's ``▁``) or merge across tokens see the same context both times.
    The pieces joined equal ``tokenizer.decode`` of all ids; for SentencePiece's byte
    fallback, which decodes a run of byte tokens as a whole, when the bytes are
    valid UTF-8.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._window_start = 0  # first token of the piece released last
        self._released = 0  # tokens whose text has been released

    def push(self, token_id: int) -> str:
        """The complete text ``token_id`` adds; "" while a character is incomplete."""
        self.token_ids.append(token_id)
        return self._release(final=False)

    def flush(self) -> str:
        """Whatever is held back (at the end of generation), incomplete or not."""
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        decode = self.tokenizer.decode
        before = decode(self.token_ids[self._window_start : self._released])
        text = decode(self.token_ids[self._window_start :])
        if len(text) <= len(before) or (text.endswith("\ufffd") and not final):
            return ""
        self._window_start, self._released = self._released, len(self.token_ids)
        return text[len(before) :]


def _chat_template(folder: Path, config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The template and where it was found: chat_template.jinja (transformers 5 saves it
    so), else tokenizer_config.json's ``chat_template``: a string, or a list of named
    templates of which "default"."""
    if model_file_exists(folder, "chat_template.jinja"):
        template = _read_text(folder, "chat_template.jinja", TEMPLATE_LIMIT)
        return template, str(folder / "chat_template.jinja")
    origin = f"{folder / 'tokenizer_config.json'} (chat_template)"
    template = config.get("chat_template")
    if isinstance(template, list):
        template = _named_templates(template, origin).get("default")
    elif template is not None and not isinstance(template, str):
        raise CheckpointError(
            f"{origin}: a {_json_type(template)}; a chat template is a string, or a list of "
            '{"name": ..., "template": ...} objects: download the tokenizer files again'
        )
    if template is None:
        return None, None
    if len(template) > TEMPLATE_LIMIT:
        raise CheckpointError(
            f"{origin}: {len(template):,} characters, over the {TEMPLATE_LIMIT:,} slotwise "
            "reads as a chat template; it is not the template it should be: download the "
            "tokenizer files again"
        )
    return template, origin


def _read_text(folder: Path, name: str, limit: int) -> str:
    data = read_model_file(folder, name, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(
            f"{folder / name}: not UTF-8 text ({exc}); download it again"
        ) from exc


def _named_templates(entries: list[Any], origin: str) -> dict[str, str]:
    """A list of named chat templates by name; every entry must be a string pair."""
    named = {}
    for number, entry in enumerate(entries):
        problem = _template_entry_problem(entry)
        if problem is not None:
            raise CheckpointError(
                f"{origin}: entry {number} {problem}; each entry of a list of chat templates "
                'is {"name": string, "template": string}: download the tokenizer files again'
            )
        named[entry["name"]] = entry["template"]
    return named


def _template_entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return f"is a {_json_type(entry)}"
    for key in ("name", "template"):
        if key not in entry:
            return f"has no {key!r}"
        if not isinstance(entry[key], str):
            return f"has a {key!r} that is a {_json_type(entry[key])}"
    return None


def _json_type(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages that must not echo the value."""
    kinds = (
        (type(None), "null"),
        (bool, "boolean"),
        ((int, float), "number"),
        (str, "string"),
        (list, "list"),
    )
    return next((kind for types, kind in kinds if isinstance(value, types)), "object")


def _read_json(folder: Path, name: str) -> dict[str, Any]:
    """The JSON object in ``folder / name``; {} when there is no such file."""
    path = folder / name
    if not model_file_exists(folder, name):
        return {}
    data = read_model_json(folder, name, limit=JSON_LIMIT)
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{path}: holds a {_json_type(data)}, not a JSON object; download it again"
        )
    return data


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken
    object ({"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any, path: Path) -> tuple[int, ...]:
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise CheckpointError(f"{path}: eos_token_id is {value!r}; expected an id or a list")
    return tuple(ids)
