"""A checkpoint's chat template, rendered within bounds.

A chat template is a Jinja program that comes with a downloaded checkpoint.  Jinja's
sandbox keeps it from Python's internals, but not from building ten gigabytes in one
operation (``'x' * 10**10``), looping for hours or recursing until the interpreter
gives up.  Here each rendering gets a budget: no value, and not the output, longer
than :data:`MIN_CHARACTERS` plus four times the conversation's own size; as many
loop iterations in all; calls nested at most :data:`MAX_CALL_DEPTH` deep; and
:data:`SECONDS` of time.  The operations that can build a large value in one step
(``*``, ``+``, ``%``, ``**``, ``~``, the filters and string methods that pad, repeat,
replace, join, format or write out a value) have their result's size predicted
before they run, so nothing far over the budget is ever built; filters that return an
iterator are read out under the same budget.  Whatever goes wrong, an exhausted
budget or any Python exception, ends in one CheckpointError naming the template and
its line.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import string
import time
import traceback
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sized
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from slotwise_engine.models.errors import CheckpointError

#: The size, in characters, that any value and the output may reach whatever the
#: conversation; a longer conversation adds four times its own size.
MIN_CHARACTERS = 1 << 20
#: The time one rendering may take (real templates take milliseconds).
SECONDS = 10.0
#: How many times its budget of characters a rendering may write out in all, counting
#: what macros and blocks write out again.
OUTPUT_FACTOR = 16
#: How deep calls (macros, recursive loops) may nest.
MAX_CALL_DEPTH = 64
#: The largest integer a template may compute, in bits.
MAX_INT_BITS = 1 << 16
#: The widest indentation ``tojson`` writes.
MAX_JSON_INDENT = 64


class TemplateRefusal(jinja2.TemplateError):
    """Raised by a template's ``raise_exception``: the conversation is at fault, not
    the template."""


class _OverBudget(Exception):
    """The template went past its rendering's budget."""


def render_chat_template(template: str, origin: str, variables: Mapping[str, Any]) -> str:
    """``template`` rendered with ``variables``; ``origin`` names the template in errors
    ("<folder>/chat_template.jinja")."""
    input_size, _ = _footprint(dict(variables), cap=float("inf"))
    budget = _Budget(MIN_CHARACTERS + 4 * input_size, SECONDS)
    budget.remember(variables)
    try:
        compiled = _BoundedEnvironment(budget).from_string(template)
        pieces: list[str] = []
        size = 0
        for piece in compiled.generate(**variables):
            size += len(piece)
            budget.check(size, "the output")
            budget.tick()
            pieces.append(piece)
        return "".join(pieces)
    except TemplateRefusal as exc:
        raise CheckpointError(
            f"{origin}: the chat template refuses this conversation: {exc}"
        ) from None
    except Exception as exc:  # any failure of a downloaded program is the template's
        raise CheckpointError(_failure(origin, exc)) from exc


def raise_exception(message: str) -> None:
    """Lets templates refuse a conversation they cannot render (``raise_exception(...)``)."""
    raise TemplateRefusal(message)


def strftime_now(format: str) -> str:
    """Today's date for templates that print it (Llama 3.1 and later)."""
    return datetime.now().strftime(format)


class _Budget:
    """What one rendering may still spend."""

    def __init__(self, characters: int, seconds: float) -> None:
        self.characters = characters
        self.iterations = characters
        self.produced = OUTPUT_FACTOR * characters
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.depth = 0
        # id -> (value, size) of containers measured already; the template cannot
        # change a list or dict (the sandbox is immutable), so a size stays valid.
        self._sizes: dict[int, tuple[Any, int]] = {}

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _OverBudget(f"it ran longer than {self.seconds:g} s")

    def iterate(self) -> None:
        self.iterations -= 1
        if self.iterations < 0:
            raise _OverBudget(f"its loops ran more than {self.characters:,} iterations")
        self.tick()

    def produce(self, size: int) -> None:
        """Counts characters written out or built by a filter, which blocks and macros
        collect before they join them."""
        self.produced -= size
        if self.produced < 0:
            raise _OverBudget(
                f"it wrote out more than {OUTPUT_FACTOR * self.characters:,} characters in all"
            )

    def check(self, size: int, what: str) -> None:
        if size > self.characters:
            raise _OverBudget(
                f"{what} would be {size:,} characters or more, over the "
                f"{self.characters:,} this rendering allows"
            )

    def size(self, value: Any) -> int:
        """An upper bound of ``value``'s length written out, counted up to the budget."""
        if isinstance(value, str):
            return len(value)
        if not isinstance(value, (list, tuple, dict)):
            return _footprint(value, self.characters)[0]
        known = self._sizes.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        size, fixed = _footprint(value, self.characters)
        if fixed:
            self._sizes[id(value)] = (value, size)
        return size

    def remember(self, variables: Mapping[str, Any]) -> None:
        """Measures the render's inputs (and each message) once, for all calls."""
        for value in variables.values():
            self.size(value)
            if isinstance(value, (list, tuple)):
                for item in value:
                    self.size(item)


def _footprint(value: Any, cap: float) -> tuple[int, bool]:
    """An upper bound of the characters ``value`` takes written out (str() or JSON),
    counted until it passes ``cap``: a value held twice counts twice, as writing it
    out does.  The flag is False when a namespace, which templates change, is inside."""
    total = 0
    fixed = True
    pending = [value]
    while pending and total <= cap:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2
        elif item is None or isinstance(item, float):
            total += 24
        elif isinstance(item, Namespace):
            fixed = False
            # A namespace writes out its attributes, which Jinja keeps under this name.
            pending.append(dict(object.__getattribute__(item, "_Namespace__attrs")))
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            if total <= cap:
                pending.extend(item.keys())
                pending.extend(item.values())
        elif isinstance(item, range):  # written out number by number when joined
            widest = max(abs(item.start), abs(item.stop))
            total += 2 + len(item) * (widest.bit_length() // 3 + 3)
        elif isinstance(item, Collection):
            total += 2 + 2 * len(item)
            if total <= cap:
                pending.extend(item)
        else:
            total += 64
    return total, fixed


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, Sized) else 0


def _number(value: Any) -> int:
    return abs(value) if isinstance(value, int) else 0


def _digits(text: str) -> int:
    """A width or precision written in a format; longer than 9 digits is too wide anyway."""
    return int(text) if len(text) < 10 else 10**10


def _replaced(budget: _Budget, s: Any, old: Any, new: Any, count: Any) -> int:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return budget.size(s)
    found = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(s) + found * len(new)


def _joined(budget: _Budget, items: Any, separator: Any) -> int:
    return budget.size(items) + _sized(items) * budget.size(separator)


_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.DOTALL)


def _printf_size(budget: _Budget, template: str, values: Any) -> int:
    """An upper bound of ``template % values``."""
    if isinstance(values, Mapping):
        items = list(values.values())
    else:
        items = list(values) if isinstance(values, tuple) else [values]
    widest = max((budget.size(item) for item in items), default=0)
    star = max((_number(item) for item in items), default=0)
    size = len(template)
    for width, precision, kind in _PRINTF.findall(template):
        if kind != "%":
            pads = [star if text == "*" else _digits(text) for text in (width, precision) if text]
            size += widest + max(pads, default=0)
    return size


def _format_size(budget: _Budget, template: str, args: Any, kwargs: Mapping[str, Any]) -> int:
    """An upper bound of ``template.format(*args, **kwargs)``."""
    items = [*args, *kwargs.values()]
    widest = max((budget.size(item) for item in items), default=0)
    star = max((_number(item) for item in items), default=0)
    size = 0
    for literal, field, spec, _ in string.Formatter().parse(template):
        size += len(literal)
        if field is not None:
            pads = [_digits(text) for text in re.findall(r"\d+", spec or "")]
            if spec and "{" in spec:  # a width taken from an argument
                pads.append(star)
            size += widest + max(pads, default=0)
    return size


def _format_map_size(
    budget: _Budget, template: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> int:
    mapping = args[0] if len(args) == 1 and isinstance(args[0], Mapping) else {}
    return _format_size(budget, template, (), mapping)


def _indented_size(budget: _Budget, arguments: Mapping[str, Any]) -> int:
    text, width = arguments["s"], arguments["width"]
    lines = text.count("\n") + 1 if isinstance(text, str) else budget.size(text)
    return budget.size(text) + lines * (_number(width) + budget.size(width))


def _sum_size(budget: _Budget, arguments: Mapping[str, Any]) -> int:
    if isinstance(arguments["start"], (int, float)):
        return 0
    # Adding sequences copies the total so far at each step.
    items = arguments["iterable"]
    return _sized(items) * budget.size(items)


def _wrapped_size(budget: _Budget, arguments: Mapping[str, Any]) -> int:
    text, width = arguments["s"], arguments["width"]
    if not isinstance(text, str):
        return budget.size(text)
    lines = len(text) // max(1, _number(width)) + text.count("\n") + 1
    return len(text) + lines * max(1, budget.size(arguments["wrapstring"] or ""))


def _argument(args: tuple[Any, ...], index: int, default: Any) -> Any:
    return args[index] if len(args) > index else default


#: An upper bound of the result of each string method that can build a long string,
#: from the string and the call's positional and keyword arguments.
_STRING_METHODS: dict[str, Callable[[_Budget, str, tuple[Any, ...], Mapping[str, Any]], int]] = {
    "center": lambda b, s, a, k: len(s) + _number(_argument(a, 0, None)),
    "ljust": lambda b, s, a, k: len(s) + _number(_argument(a, 0, None)),
    "rjust": lambda b, s, a, k: len(s) + _number(_argument(a, 0, None)),
    "zfill": lambda b, s, a, k: len(s) + _number(_argument(a, 0, None)),
    "expandtabs": lambda b, s, a, k: (
        len(s) + s.count("\t") * _number(_argument(a, 0, k.get("tabsize", 8)))
    ),
    "replace": lambda b, s, a, k: _replaced(
        b, s, _argument(a, 0, None), _argument(a, 1, None), _argument(a, 2, -1)
    ),
    "join": lambda b, s, a, k: _joined(b, _argument(a, 0, None), s),
    "format": _format_size,
    "format_map": _format_map_size,
}

#: The same for filters, from their arguments by name (the value included).
_FILTERS: dict[str, Callable[[_Budget, Mapping[str, Any]], int]] = {
    "center": lambda b, a: b.size(a["value"]) + _number(a["width"]),
    "indent": _indented_size,
    "replace": lambda b, a: _replaced(b, a["s"], a["old"], a["new"], a["count"]),
    "join": lambda b, a: _joined(b, a["value"], a["d"]),
    "wordwrap": _wrapped_size,
    "format": lambda b, a: _printf_size(b, str(a["value"]), a["kwargs"] or a["args"]),
    "batch": lambda b, a: _number(a["linecount"]) + b.size(a["value"]),
    "slice": lambda b, a: _number(a["slices"]) + b.size(a["value"]),
    "sum": _sum_size,
}


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's compiler, with ``~`` and every loop routed through the environment's
    checks."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.concat_values((")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))")

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        guard = nodes.EnvironmentAttribute("guard_loop", lineno=node.lineno)
        guarded = nodes.Call(guard, [node.iter], [], None, None, lineno=node.iter.lineno)
        fields = [guarded if name == "iter" else getattr(node, name) for name in node.fields]
        super().visit_For(nodes.For(*fields, lineno=node.lineno), frame)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox of chat templates, every step of it metered by ``budget``."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, budget: _Budget) -> None:
        # trim_blocks/lstrip_blocks: templates are written for them; not optimized, so
        # no expression is evaluated, unmetered, while compiling.
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"],
            optimized=False,
            finalize=self._finalize,
        )
        self.budget = budget
        self.filters["tojson"] = self._tojson
        self.filters = {name: self._bounded_filter(name, f) for name, f in self.filters.items()}
        del self.globals["lipsum"]  # filler text: no business of a chat template
        self.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = self.budget
        budget.tick()
        method = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        owner = getattr(method, "__self__", None)
        predict = _STRING_METHODS.get(getattr(method, "__name__", ""))
        if isinstance(owner, str) and predict is not None:
            passed = {k: v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars")}
            budget.check(predict(budget, owner, args, passed), f"str.{method.__name__}()")
        budget.depth += 1
        try:
            if budget.depth > MAX_CALL_DEPTH:
                raise _OverBudget(
                    f"calls nest more than {MAX_CALL_DEPTH} deep (a macro or a recursive loop "
                    "that never ends)"
                )
            result = super().call(context, obj, *args, **kwargs)
        finally:
            budget.depth -= 1
        budget.check(budget.size(result), "a call's result")
        return result

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = self.budget
        budget.tick()
        what = f"the operator {operator!r}"
        if operator == "*":
            if isinstance(left, int) and isinstance(right, int):
                _check_bits(left.bit_length() + right.bit_length(), what)
            elif isinstance(right, int):
                budget.check(budget.size(left) * abs(right), what)
            elif isinstance(left, int):
                budget.check(budget.size(right) * abs(left), what)
        elif operator == "+" and not isinstance(left, (int, float)):
            budget.check(budget.size(left) + budget.size(right), what)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if abs(left) > 1 and right > 0:
                _check_bits(left.bit_length() * right, what)
        elif operator == "%" and isinstance(left, str):
            budget.check(_printf_size(budget, left, right), what)
        return super().call_binop(context, operator, left, right)

    def concat(self, pieces: Iterable[str]) -> str:  # type: ignore[override]
        """The output of a block, macro or call (Jinja's join of collected pieces)."""
        collected = []
        size = 0
        for piece in pieces:
            size += len(piece)
            self.budget.check(size, "a block's output")
            collected.append(piece)
        return "".join(collected)

    def concat_values(self, values: tuple[Any, ...]) -> str:
        """``a ~ b``: the values written out and joined."""
        self.budget.tick()
        self.budget.check(sum(self.budget.size(value) for value in values), "the operator '~'")
        return "".join(map(str, values))

    def guard_loop(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Each item of a ``for`` loop, counted against the budget."""
        for item in iterable:
            self.budget.iterate()
            yield item

    def _finalize(self, value: Any) -> Any:
        """Every ``{{ ... }}``, before it is written out."""
        budget = self.budget
        budget.tick()
        size = budget.size(value)
        budget.check(size, "an expression written out")
        budget.produce(size)
        return value

    def _tojson(self, value: Any, indent: int | None = None) -> str:
        # Plain JSON (jinja2's own tojson escapes HTML and sorts keys), written out piece
        # by piece when indented, since indentation grows with the depth.
        if indent is None:
            return json.dumps(value, ensure_ascii=False)
        if not isinstance(indent, int) or not 0 <= indent <= MAX_JSON_INDENT:
            raise ValueError(f"tojson's indent is {indent!r}; it must be 0 to {MAX_JSON_INDENT}")
        pieces = []
        size = 0
        for piece in json.JSONEncoder(ensure_ascii=False, indent=indent).iterencode(value):
            size += len(piece)
            self.budget.check(size, "the filter 'tojson'")
            pieces.append(piece)
        return "".join(pieces)

    def _bounded_filter(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        predict = _FILTERS.get(name)
        signature = _signature(function) if predict is not None else None
        # A context, evaluation context or environment Jinja passes first is no value.
        first = 1 if hasattr(function, "jinja_pass_arg") else 0
        what = f"the filter {name!r}"

        @functools.wraps(function)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            budget = self.budget
            budget.tick()
            for value in (*args[first:], *kwargs.values()):
                budget.check(budget.size(value), f"an argument of {what}")
            if predict is not None and signature is not None:
                arguments = signature.bind(*args, **kwargs)
                arguments.apply_defaults()
                budget.check(predict(budget, arguments.arguments), what)
            result = function(*args, **kwargs)
            if isinstance(result, Iterator):  # map, select, batch...: read out, counted
                result = _read_out(budget, result, what)
            size = budget.size(result)
            budget.check(size, what)
            budget.produce(size)
            return result

        return bounded


@functools.cache
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(function)


def _read_out(budget: _Budget, items: Iterator[Any], what: str) -> list[Any]:
    collected = []
    size = 0
    for item in items:
        budget.iterate()
        size += budget.size(item)
        budget.check(size, what)
        collected.append(item)
    return collected


def _check_bits(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise _OverBudget(f"{what} would make an integer of {bits:,} bits or more")


def _failure(origin: str, exc: Exception) -> str:
    line = _template_line(exc)
    where = f" at line {line}" if line is not None else ""
    if isinstance(exc, _OverBudget):
        return (
            f"{origin}: the chat template failed{where}: {exc}; a chat template only lays out "
            "the messages: fix the template, or prompt without it"
        )
    text = " ".join(str(exc).split())  # one line, whatever the exception wrote
    if len(text) > 300:
        text = text[:300] + "..."
    return (
        f"{origin}: the chat template failed{where}: {type(exc).__name__}: {text}; fix the "
        "template, or prompt without it"
    )


def _template_line(exc: Exception) -> int | None:
    """The template line an error was raised at (Jinja's tracebacks point there)."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return exc.lineno
    lines = [
        line
        for frame, line in traceback.walk_tb(exc.__traceback__)
        if frame.f_code.co_filename == "<template>"
    ]
    return lines[-1] if lines else None
