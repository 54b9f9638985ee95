"""Chat templates rendered within bounds, and prompts tokenized so that the special tokens a
message's text spells stay text.

A chat template is a program that comes with the model's files. transformers renders it in
jinja2's sandbox, which keeps it from Python's internals but not from running forever: two
nested `{% for %}` over range(100000), a macro that calls itself twice, `9 ** 999999999`
(computed at compile time) or `'a' * 10**12` hang the renderer or fill memory, and a render
on a worker thread cannot be stopped. So templates are compiled here, in a sandbox with
transformers' settings, filters and globals that also bounds their work:

- every loop iteration, call and filter is a step: at most MAX_STEPS a render, and the clock
  is read at each one (at most MAX_SECONDS);
- every string, list or int a template builds (an operator, a `~`, a call, a filter, a
  block's text) and its output hold at most MAX_LENGTH items (ints: MAX_INT_BITS); `*`, `**`
  and joins are checked before they run, since one of them alone (`'a' * 10**12`,
  `[s] * 1000|join`) is enough to fill memory;
- nothing of the template runs at compile time (jinja's constant folding is off), and
  `lipsum`, whose arguments are loop counts run inside one call, is left out.

Past a bound the render stops with a TemplateLimitError naming it (recursion past Python's
limit too). What is not bounded before it runs is one string operation of a width the
template states (`x.center(10**9)`, `'%*s'`, `replace`): it costs that memory once (past the
machine's memory, a MemoryError), then the size check refuses its result.

Special tokens: a user who writes `<|im_start|>system` in a message must not open a system
turn. `render(mark_special_tokens=True)` puts markers around the control tokens in the
caller's strings (messages, tools, template variables); `tokenize` tokenizes those as the
text they spell and the rest (what the template wrote) as usual. A reasoning format's plain
tags (`<think>`, `</think>`: added tokens, not special ones) are left unmarked when the caller
says so: templates split an assistant turn's text on them and strip what is around them, as
they do under transformers, and a marker beside a tag would defeat that.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# A render's bounds, far above what a real template takes: a few steps per message and
# milliseconds (docs/reliability.md).
MAX_STEPS = 1_000_000
MAX_SECONDS = 2.0
# 16M characters are over a million tokens of text: more than any prompt can hold.
MAX_LENGTH = 1 << 24
MAX_INT_BITS = 1 << 16

# Around a control token from a caller's string (Unicode's last private-use plane: no text
# uses it, and tojson keeps it as it is).
_OPEN, _CLOSE = "\U00100000", "\U00100001"


class TemplateLimitError(ValueError):
    """A chat template ran past a bound of its render."""


@dataclass
class _Budget:
    steps_left: int
    deadline: float


_BUDGET: ContextVar[_Budget] = ContextVar("braid_template_budget")


def _step() -> None:
    budget = _BUDGET.get()
    budget.steps_left -= 1
    if budget.steps_left < 0:
        raise TemplateLimitError(
            f"the chat template took more than {MAX_STEPS:,} steps (loop iterations, calls "
            "and filters) to render: it loops without end, or nearly"
        )
    if time.monotonic() > budget.deadline:
        raise TemplateLimitError(f"the chat template ran for more than {MAX_SECONDS:g} s")


def _counted(items: Iterable) -> Iterator:
    for item in items:
        _step()
        yield item


def _sized(value: Any) -> Any:
    """`value`, once within the bounds (an iterator: counted as it is consumed)."""
    if isinstance(value, (str, list, tuple, dict)) and len(value) > MAX_LENGTH:
        raise TemplateLimitError(
            f"the chat template built a {type(value).__name__} of {len(value):,} items "
            f"(at most {MAX_LENGTH:,})"
        )
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"the chat template built an int of over {MAX_INT_BITS} bits")
    if isinstance(value, Iterator):  # a generator a filter returned (slice(10**12), map...)
        return _counted(value)
    return value


def _check_operands(operator: str, left: Any, right: Any) -> None:
    """Refuse a `*` or `**` whose result would be past the bounds, before computing it."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                if len(seq) * n > MAX_LENGTH:
                    raise TemplateLimitError(
                        f"the chat template repeats a {type(seq).__name__} of length "
                        f"{len(seq):,} {n:,} times (at most {MAX_LENGTH:,} items)"
                    )
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        if left.bit_length() * right > MAX_INT_BITS:  # at least the result's bits
            raise TemplateLimitError(f"the chat template built an int of over {MAX_INT_BITS} bits")


def _joined(pieces: Iterable, separator: str = "") -> list:
    """`pieces` as a list, refused if joining them would build a string past the bounds."""
    pieces = list(pieces)
    total = len(separator) * max(len(pieces) - 1, 0)
    for piece in pieces:
        total += len(piece) if isinstance(piece, str) else len(str(piece))
        if total > MAX_LENGTH:
            raise TemplateLimitError(
                f"the chat template joins {len(pieces):,} strings into more than "
                f"{MAX_LENGTH:,} characters"
            )
    return pieces


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "**"})  # the ones that grow strings and ints

    @staticmethod
    def concat(pieces: Iterable[str]) -> str:
        """The text of a macro, a `{% set %}` block or a call block (jinja's buffers)."""
        return "".join(_joined(pieces))

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _check_operands(operator, left, right)
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # jinja's names: no clash with kwargs
        _step()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's loop(items)
            args = (_counted(args[0]), *args[1:])
        elif _is_str_join(__obj) and args:
            args = (_joined(args[0], __obj.__self__), *args[1:])
        return _sized(super().call(__context, __obj, *args, **kwargs))


class _Bounds(NodeTransformer):
    """Every loop's items counted as they are taken, every `~` checked for size."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, "braid_steps", [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Filter:
        self.generic_visit(node)
        return nodes.Filter(node, "braid_sized", [], [], None, None, lineno=node.lineno)


class _Generation(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks assistant text for
    its training masks): its body, rendered in a block of its own as transformers does."""

    tags = {"generation"}

    def parse(self, parser) -> nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _is_str_join(f: Any) -> bool:
    return getattr(f, "__name__", None) == "join" and isinstance(getattr(f, "__self__", None), str)


def _checked_join(join):
    @functools.wraps(join)  # keeps jinja's pass_eval_context mark
    def checked(eval_ctx, value, d="", attribute=None):
        items = list(value) if attribute is not None else _joined(value, d)
        return join(eval_ctx, items, d, attribute)

    return checked


def _bounded_filter(f):
    @functools.wraps(f)  # keeps jinja's pass_context/pass_eval_context marks
    def bounded(*args, **kwargs):
        _step()
        return _sized(f(*args, **kwargs))

    return bounded


# transformers' additions to the sandbox: what chat templates on the Hub call.
def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)`, without the dict type itself."""

    def __call__(self, *args, **kwargs) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args) -> dict:
        return dict.fromkeys(*args)


class _Namespace(Namespace):
    """jinja's namespace, refusing names that start with `_` (Python's internals)."""

    def __init__(*args, **kwargs) -> None:  # jinja's signature: namespace(self=...) works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _public(name)
        super(_Namespace, self).__init__(attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _public(name)
        super().__setitem__(name, value)


def _public(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a namespace cannot hold {name!r}")


def _environment() -> _Sandbox:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_Generation, loopcontrols],
        optimized=False,  # constant folding runs a template's expressions at compile time
    )
    env.filters["tojson"] = _tojson
    env.filters["join"] = _checked_join(env.filters["join"])
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.filters["braid_steps"] = _counted
    env.filters["braid_sized"] = _sized
    del env.globals["lipsum"]
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_Dict(),
        namespace=_Namespace,
    )
    return env


_ENV = _environment()


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    tree = _ENV.parse(source)
    _Bounds().visit(tree)
    tree.set_environment(_ENV)
    return _ENV.from_string(tree)


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    variables: dict[str, Any] | None = None,
    mark_special_tokens: bool = False,
    unmarked: frozenset[str] = frozenset(),
) -> str:
    """The conversation's text through the tokenizer's chat template, as
    `tokenizer.apply_chat_template(..., tokenize=False)` renders it, within the bounds.
    `variables`: the template's own (chat_template_kwargs). `mark_special_tokens`: the
    control tokens spelled by the caller's strings (messages, tools, variables) come out
    between markers, which `tokenize` reads; those in `unmarked` (a reasoning format's plain
    tags) stay as they are. Raises TemplateLimitError past a bound, and what the template
    raises (jinja2.TemplateError, ...) when it refuses."""
    source = tokenizer.get_chat_template(None, tools)
    controls = _control_tokens(tokenizer, source, unmarked) if mark_special_tokens else None
    # The markers are never the caller's (a caller could otherwise mark what the template
    # writes): they are dropped from its strings.
    messages, tools, variables = _mark((messages, tools, variables), controls)
    # A field given as None is left out, as transformers leaves it out: templates test
    # fields with `is defined`, and would write "None".
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    context = {**tokenizer.special_tokens_map, **(variables or {})}
    token = _BUDGET.set(_Budget(MAX_STEPS, time.monotonic() + MAX_SECONDS))
    try:
        return _generate(_compile(source), messages, tools, add_generation_prompt, context)
    except RecursionError:  # macros calling themselves: bounded by Python's stack, reported
        raise TemplateLimitError(
            "the chat template recursed deeper than Python's limit (a macro that calls "
            "itself without end?)"
        ) from None
    finally:
        _BUDGET.reset(token)


def _generate(template, messages, tools, add_generation_prompt, context) -> str:
    pieces, length = [], 0
    for piece in template.generate(
        messages=messages,
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **context,
    ):
        length += len(piece)
        if length > MAX_LENGTH:
            raise TemplateLimitError(f"the chat template wrote more than {MAX_LENGTH:,} characters")
        pieces.append(piece)
    return "".join(pieces)


def tokenize(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """The ids of a text `render` gave, as apply_chat_template(tokenize=True) has them (the
    template writes any BOS itself); the control tokens it marked are tokenized as the text
    they spell, the special tokens the template wrote as the tokens they name."""
    if _OPEN not in text and _CLOSE not in text:
        return tokenizer.encode(text, add_special_tokens=False)
    # [text, marked token or None (a lone marker), text, ..., text]. A marker the template
    # cut from its token (a slice, `|upper`) is dropped, and still separates the text on its
    # two sides, which could otherwise join into a control token.
    added = tuple(t.content for t in tokenizer.added_tokens_decoder.values())
    parts = _splitter(added).split(text)
    ids: list[int] = []
    for i, part in enumerate(parts):
        if part:
            ids += _encode_piece(tokenizer, part, plain=i % 2 == 1, at_start=not ids)
    return ids


def _control_tokens(
    tokenizer: PreTrainedTokenizerBase, template: str, unmarked: frozenset[str]
) -> re.Pattern | None:
    """A pattern of the tokenizer's control tokens, longest first: its special tokens and the
    added tokens the template writes (Qwen's <tool_call>), whitespace ones and `unmarked`
    aside."""
    texts = {
        t.content
        for t in tokenizer.added_tokens_decoder.values()
        if t.special or (t.content in template and not t.content.isspace())
    } - unmarked
    if not texts:
        return None
    return _alternatives(tuple(sorted(texts, key=lambda t: (-len(t), t))))


@functools.lru_cache(maxsize=16)
def _alternatives(texts: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(map(re.escape, texts)))


def _mark(value: Any, controls: re.Pattern | None) -> Any:
    """`value` with the markers dropped from its strings (nested in lists, tuples and dicts;
    not dict keys), and its `controls` between markers."""
    if isinstance(value, str):
        value = value.replace(_OPEN, "").replace(_CLOSE, "")
        return value if controls is None else controls.sub(_marked, value)
    if isinstance(value, dict):
        return {k: _mark(v, controls) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mark(v, controls) for v in value)
    return value


def _marked(match: re.Match) -> str:
    return _OPEN + match[0] + _CLOSE


@functools.lru_cache(maxsize=16)
def _splitter(tokens: tuple[str, ...]) -> re.Pattern:
    """A marked token (an added token between markers), or a lone marker."""
    alternatives = "|".join(map(re.escape, tokens))
    return re.compile(f"{_OPEN}({alternatives}){_CLOSE}|[{_OPEN}{_CLOSE}]")


def _encode_piece(
    tokenizer: PreTrainedTokenizerBase, text: str, plain: bool, at_start: bool
) -> list[int]:
    def ids(s: str) -> list[int]:
        return _plain_ids(tokenizer, s) if plain else tokenizer.encode(s, add_special_tokens=False)

    if at_start:
        result = ids(text)
    else:
        # From the middle of a text: SentencePiece tokenizers would begin it with a word's
        # space (▁) as they begin a text; after a newline they do not. So it is tokenized
        # after one, whose ids are then dropped (unless the newline merged with the text).
        newline = ids("\n")
        with_newline = ids("\n" + text)
        same = with_newline[: len(newline)] == newline
        result = with_newline[len(newline) :] if same else ids(text)
    if plain and len(text) > 1 and tokenizer.added_tokens_encoder.get(text) in result:
        # The vocabulary spells the token from its text too: spelled a character at a time.
        return [
            i
            for k, c in enumerate(text)
            for i in _encode_piece(tokenizer, c, True, at_start and not k)
        ]
    return result


def _plain_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text`'s ids with no added token matched: a control token's text as the characters
    it is made of."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a Python tokenizer: the switch is an argument of the call
        return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    # The Rust tokenizer's own switch (encode_special_tokens) is state shared by every thread
    # that encodes with it: its pipeline is run here without the added tokens.
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    words = [text]
    if backend.pre_tokenizer is not None:
        words = [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
    return [t.id for w in words for t in backend.model.tokenize(w)]
