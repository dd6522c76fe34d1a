"""A chat template is a program from a download: whatever it does wrong (a Python
exception, output or a value past the size budget, loops or recursion without end,
time) ends in one CheckpointError naming the template, before anything large is
built; while real templates, which use every feature of Jinja, render as
transformers renders them."""

from __future__ import annotations

import pytest
import transformers
from hf_tokenizers import make_tokenizer

from slotwise_engine.models import CheckpointError, chat_template
from slotwise_engine.models.tokenizer import Tokenizer

CHAT = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Wie heißt die Hauptstadt? 日本"},
    {"role": "assistant", "content": "Tokio.", "tool_calls": [{"name": "f", "arguments": {}}]},
    {"role": "user", "content": "  Und jetzt? 🙂  "},
]

#: Every Jinja feature templates in the wild use: namespaces, macros, loops with
#: loop.* and filters on them, tests, tojson, the operators and string methods that
#: are metered (~, +, *, %, format, replace, join, center, indent).
RICH_TEMPLATE = """
{%- set ns = namespace(system='', count=0) -%}
{%- macro render(message, index) -%}
[{{ index }}|{{ message['role'] | upper }}] {{ message['content'] | trim | replace('?', '¿') }}
{%- if message.tool_calls is defined %} calls {{ message.tool_calls | tojson }}
{{- message.tool_calls | map(attribute='name') | join(',') | center(7) }}{% endif %}
{%- endmacro -%}
{%- for message in messages if message['role'] == 'system' -%}
{%- set ns.system = ns.system ~ message['content'] -%}{%- endfor -%}
{{ bos_token }}{{ '%s: %d%%' % ('system', ns.system | length) }}
{{ ('=' * 3) + ' ' + '{}/{}'.format(messages | length, messages | selectattr('role', 'equalto',
'user') | list | length) }}
{% for message in messages[1:] -%}
{%- set ns.count = ns.count + 1 -%}
{{ render(message, loop.index) | indent(2, first=True) }}{{ ' (last)' if loop.last }}
{% endfor -%}
{{ messages | tojson(indent=2) }}
{{ ns.count ** 2 }} {{ messages | map(attribute='role') | unique | sort | join(' ') }}
{%- if add_generation_prompt %}{{ '\\n<|assistant|>' }}{% endif %}
"""


pytestmark = pytest.mark.usefixtures("never_hang")


@pytest.fixture
def folder(tmp_path):
    return make_tokenizer(tmp_path, "llama3")


def render(folder, template: str, messages=CHAT) -> str:
    (folder / "chat_template.jinja").write_text(template)
    return Tokenizer.load(folder).apply_chat_template(messages)


def transformers_render(folder, template: str, messages=CHAT) -> str:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=True
    )


def test_a_rich_template_renders_as_transformers_renders_it(folder):
    text = render(folder, RICH_TEMPLATE)
    assert "calls [{" in text and "  [1|USER]" in text  # the template did its work
    assert text == transformers_render(folder, RICH_TEMPLATE)


def test_a_conversation_longer_than_the_minimum_budget_still_renders(folder):
    long = [{"role": "user", "content": "Lorem ipsum dolor. " * 200_000}]  # 3.8 MB
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}"
    text = render(folder, template, long)
    assert len(text) > 2 * chat_template.MIN_CHARACTERS
    assert text == transformers_render(folder, template, long)


HOSTILE = {
    "format_map without a mapping": (
        "{{ '{a}'.format_map() }}",
        "TypeError: format_map",
    ),
    "format_map of a missing key": ("{{ '{a}'.format_map({}) }}", "KeyError: 'a'"),
    "a string of ten billion": ("{{ 'x' * 10**10 }}", "the operator '\\*' would be 10,000,000,000"),
    "a list of ten billion": ("{{ ([1] * 10**10) | length }}", "the operator '\\*' would be"),
    "an integer of ten billion digits": ("{{ 10 ** (10 ** 10) }}", "an integer of 40,000,000,000"),
    "repeated squaring": (
        "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}"
        "{% endfor %}",
        "the operator '\\*' would make an integer",
    ),
    "doubling with ~": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        "the operator '~' would be",
    ),
    "doubling with +": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}",
        "the operator '\\+' would be",
    ),
    "a recursive macro": (
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "calls nest more than 64 deep",
    ),
    "a recursive loop": (
        "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
        "calls nest more than 64 deep",
    ),
    "ten billion loop iterations": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "its loops ran more than",
    ),
    "a padding width": ("{{ 'x' | center(10000000000) }}", "the filter 'center' would be"),
    "a padding method": ("{{ 'x'.ljust(10000000000) }}", "str.ljust\\(\\) would be"),
    "a format width": ("{{ '{:>10000000000}'.format(1) }}", "str.format\\(\\) would be"),
    "a width as an argument": (
        "{{ '{:{w}}'.format(1, w=10000000000) }}",
        "str.format\\(\\) would be",
    ),
    "a printf width": ("{{ '%10000000000s' % 1 }}", "the operator '%' would be"),
    "a wrap string": (
        "{{ ('x ' * 100000) | wordwrap(1, wrapstring='y' * 100000) }}",
        "the filter 'wordwrap' would be",
    ),
    "an indentation": (
        "{{ ('\\n' * 100000) | indent(100000) }}",
        "the filter 'indent' would be",
    ),
    "a replacement": (
        "{% set s = 'x' * 100000 %}{{ s | replace('', s) }}",
        "the filter 'replace' would be",
    ),
    "tabs": ("{{ ('\\t' * 100000).expandtabs(100000) }}", "str.expandtabs\\(\\) would be"),
    "a join of mapped paddings": (
        "{{ range(100000) | map('string') | map('center', 1000000) | join }}",
        "the filter 'map' would be",
    ),
    "a literal list of one big string": (
        "{% set s = 'x' * 1000000 %}{{ [" + "s, " * 3 + "] }}",
        "an expression written out would be",
    ),
    "a namespace holding one big string thrice": (
        "{% set s = 'x' * 1000000 %}{% set ns = namespace() %}{% set ns.l = [s, s, s] %}{{ ns }}",
        "an expression written out would be",
    ),
    "a macro collecting its output": (
        "{% macro big() %}{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}"
        "{% endmacro %}{% set x = big() %}",
        "it wrote out more than",
    ),
    "an endless output": (
        "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
        "the output would be",
    ),
    "sums of lists": ("{{ ([[1]] * 100000) | sum(start=[]) }}", "the filter 'sum' would be"),
    "an indentation of a billion": (
        "{{ messages | tojson(indent=10**9) }}",
        "ValueError: tojson's indent",
    ),
    "a sandbox escape": ("{{ ''.__class__.__mro__ }}", "UndefinedError|SecurityError"),
    "a mutation": ("{{ messages.append(1) }}", "SecurityError"),
    "a syntax error": ("{% for %}", "TemplateSyntaxError"),
    "a literal nested too deep": ("{{ " + "[" * 100000 + "]" * 100000 + " }}", "RecursionError"),
}


@pytest.mark.parametrize("template, reason", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_template_ends_in_one_error_naming_it(folder, template, reason):
    with pytest.raises(CheckpointError) as caught:
        render(folder, template)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'chat_template.jinja'}: the chat template failed")
    assert caught.match(reason)
    assert "\n" not in message


def test_the_error_names_the_template_line(folder):
    with pytest.raises(CheckpointError, match="failed at line 3: "):
        render(folder, "a\nb\n{{ 'x' * 10**10 }}")


def test_a_template_in_tokenizer_config_is_named_so(folder):
    tokenizer = Tokenizer.load(folder)
    tokenizer.chat_template = "{{ 'x'.format_map() }}"
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json \(chat_template\): the"):
        tokenizer.apply_chat_template(CHAT)


def test_a_slow_template_stops_at_the_deadline(folder, monkeypatch):
    monkeypatch.setattr(chat_template, "SECONDS", 0.05)
    # A million iterations: under the iteration budget, far over 50 ms.
    template = (
        "{% for i in range(1000) %}{% for j in range(1000) %}{{ '' }}{% endfor %}{% endfor %}"
    )
    with pytest.raises(CheckpointError, match="it ran longer than 0.05 s"):
        render(folder, template)


def test_a_template_refusing_the_conversation_says_so(folder):
    with pytest.raises(CheckpointError, match="refuses this conversation: no system role"):
        render(folder, "{{ raise_exception('no system role') }}")
