"""Small tokenizers trained at test time with ``tokenizers``, saved as checkpoints save them.

Three styles, after the model families slotwise loads:

* ``llama3``: byte-level BPE; tokenizer.json's post-processor adds ``<|begin_of_text|>``;
  a header/eot chat template; generation_config.json lists two end ids;
* ``qwen2``: byte-level BPE, no BOS at all, a ChatML template;
* ``mistral``: SentencePiece-style BPE (``▁`` for spaces, byte fallback ``<0x..>``
  tokens), ``<s>`` added by the post-processor, an ``[INST]`` template that calls
  ``raise_exception`` for roles out of order.

The training text mixes scripts (German, French, Japanese, an emoji) so that many
characters stay split into several byte tokens.  transformers reads the same folder
as the oracle.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

TEXT = [
    "Hello world, this is a small text for a small tokenizer.",
    "The quick brown fox jumps over the lazy dog. It was a sunny day!",
    "Grüße aus Köln: schöne Bücher, Straße und Übermut.",
    "Ça va ? Très bien, merci. Où est la gare ?",
    "日本語のテキストです。東京と大阪。",
    "emoji 🙂 and numbers 12345 and more words: token, tokens, tokenizer.",
]

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)

#: style -> (special tokens, bos, eos, tokenizer_class, chat template)
STYLES = {
    "llama3": (
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|eot_id|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
        ],
        "<|begin_of_text|>",
        "<|eot_id|>",
        "PreTrainedTokenizerFast",
        LLAMA3_TEMPLATE,
    ),
    "qwen2": (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        None,
        "<|im_end|>",
        "Qwen2Tokenizer",
        CHATML_TEMPLATE,
    ),
    "mistral": (["<unk>", "<s>", "</s>"], "<s>", "</s>", "LlamaTokenizer", MISTRAL_TEMPLATE),
}


def make_tokenizer(folder: Path, style: str = "llama3", *, vocab_size: int = 300) -> Path:
    """Train a tokenizer of ``style`` with ``vocab_size`` ids and save it into ``folder``
    (tokenizer.json, tokenizer_config.json and, for llama3, generation_config.json)."""
    specials, bos, eos, tokenizer_class, template = STYLES[style]
    tokenizer = (
        _mistral(specials, vocab_size) if style == "mistral" else _byte_level(specials, vocab_size)
    )
    if bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tokenizer.token_to_id(bos))],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    assert tokenizer.get_vocab_size() == vocab_size, tokenizer.get_vocab_size()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": tokenizer_class,
        "bos_token": bos,
        "eos_token": eos,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    if style == "llama3":
        ends = [tokenizer.token_to_id("<|end_of_text|>"), tokenizer.token_to_id("<|eot_id|>")]
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return folder


def _byte_level(specials: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    return tokenizer


def _mistral(specials: list[str], vocab_size: int) -> Tokenizer:
    """SentencePiece's layout: specials, the 256 byte tokens, then pieces and merges."""
    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    pieces = Tokenizer(models.BPE())
    pieces.pre_tokenizer = metaspace
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trained_size = vocab_size - len(specials) - len(bytes_)
    pieces.train_from_iterator(
        TEXT, trainers.BpeTrainer(vocab_size=trained_size, limit_alphabet=50, show_progress=False)
    )
    state = json.loads(pieces.model.__getstate__())
    trained = sorted(state["vocab"], key=state["vocab"].get)
    vocab = {token: i for i, token in enumerate(specials + bytes_ + trained)}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tokenizer = Tokenizer(
        models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tokenizer.add_special_tokens(specials)
    tokenizer.pre_tokenizer = metaspace
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return tokenizer
