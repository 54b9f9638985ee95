"""Grammars composed in Python (braid.compose): each combinator's regex against Python's `re`
(texts accepted and refused), random compositions against the same grammar in lark, `json`
against jsonschema, `substring` against Python's `in`; captures against the pieces a text
was built from; composed grammars through gens on a scripted backend (exact texts) and on
the tiny model (the engine's constraint)."""

from __future__ import annotations

import functools
import itertools
import operator
import random
import re
from typing import Annotated

import jsonschema
import lark
import msgspec
import pytest
from backend_doubles import ScriptedBase

import braid
from braid import (
    capture,
    gen,
    json,
    one_of,
    one_or_more,
    optional,
    program,
    regex,
    substring,
    zero_or_more,
)
from braid.compose import MAX_SUBSTRING_CHUNKS
from braid.grammars import Regex, compile
from braid.interpreter import ChatTemplate, LocalBackend
from braid.runtime.protocol import GenerateOutput

Small = Annotated[int, msgspec.Meta(ge=0, le=99)]


class Point(msgspec.Struct):
    x: Small
    y: Small


POINT_SCHEMA = msgspec.json.schema(Point)

# (grammar, texts it accepts, texts it refuses)
CASES = {
    "literal": (one_of("a.b*(c)"), ["a.b*(c)"], ["a.b", "axb*(c)", "a.bb*(c)", ""]),
    "regex": (regex(r"[0-9]{2,3}"), ["12", "123"], ["1", "1234", "ab"]),
    "regex alternatives stay inside": (regex("a|b") + "c", ["ac", "bc"], ["a", "c", "abc"]),
    "one_of": (one_of("yes", "no", regex("[0-9]")), ["yes", "no", "7"], ["yesno", "", "77"]),
    "one_of a list": (one_of(["red", "green"]), ["red", "green"], ["blue", "redgreen"]),
    "one_or_more": (one_or_more("ab"), ["ab", "abab", "ababab"], ["", "a", "aba", "ba"]),
    "zero_or_more": (zero_or_more(one_of("a", "bc")), ["", "a", "bca", "aabc"], ["b", "cb"]),
    "optional": ("x" + optional("-y") + "z", ["xz", "x-yz"], ["x-z", "x-y-yz", "xyz"]),
    "capture": (capture(regex("[a-z]+"), "w") + "!", ["abc!"], ["abc", "ABC!", "!"]),
    "json": (
        json(Point),
        ['{"x":1,"y":99}', '{"x":0,"y":-0}', '{ "x": 1, "y": 2 }\n'],
        ['{"x":1}', '{"y":2,"x":1}', '{"x":1.5,"y":2}', '{"x" 1,"y":2}', '{"x":100,"y":1}'],
    ),
    "substring": (substring("The quick fox."), ["quick", "The quick", " fox."], ["uick", "fx"]),
    "nested": (
        "["
        + optional(capture(json({"type": "integer"}), "n") + zero_or_more("," + regex("-?[0-9]")))
        + "]",
        ["[]", "[1]", "[1,-2,3]", "[-20,3]"],
        ["[,]", "[1,]", "[01]", "[1, 2]", "[1,22]"],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_each_combinator_accepts_and_refuses_as_re_does(case):
    grammar, accepted, refused = CASES[case]
    pattern = re.compile(grammar.regex)
    for text in accepted:
        assert pattern.fullmatch(text), (case, text)
        grammar.captures(text)  # the pattern with named groups accepts it too
    for text in refused:
        assert not pattern.fullmatch(text), (case, text)
        with pytest.raises(ValueError, match="does not match the grammar"):
            grammar.captures(text)
    assert "(?P<" not in grammar.regex  # the engine's constraint has no named groups


def test_text_joins_as_a_literal_on_either_side():
    grammar = "a+" + regex("[0-9]") + "?"
    assert re.fullmatch(grammar.regex, "a+1?")
    assert not re.fullmatch(grammar.regex, "aa1")
    assert not re.fullmatch(grammar.regex, "a+1")


def _random_grammar(rng: random.Random, depth: int) -> tuple[object, str, bool]:
    """A random composition over the letters a, b, c: (the braid grammar or literal text, the
    same as a lark expression, whether it accepts the empty text)."""
    kind = rng.choice(["literal", "one_of", "seq", "plus", "star", "opt"])
    if depth == 0 or kind == "literal":
        text = "".join(rng.choice("abc") for _ in range(rng.randint(1, 2)))
        return (text if rng.random() < 0.5 else regex(text)), f'"{text}"', False
    if kind in ("one_of", "seq"):
        parts = [_random_grammar(rng, depth - 1) for _ in range(rng.randint(2, 3))]
        pieces, exprs, empties = zip(*parts, strict=True)
        if kind == "one_of":
            return one_of(*pieces), "(" + " | ".join(exprs) + ")", any(empties)
        return functools.reduce(operator.add, pieces), "(" + " ".join(exprs) + ")", all(empties)
    item, expr, empty = _random_grammar(rng, depth - 1)
    if kind == "opt" or empty:  # a repetition of what accepts "" is refused (tested below)
        return optional(item), f"({expr})?", True
    if kind == "plus":
        return one_or_more(item), f"({expr})+", False
    return zero_or_more(item), f"({expr})*", True


@pytest.mark.parametrize("seed", range(40))
def test_random_compositions_accept_what_lark_parses(seed):
    grammar, expr, empty = _random_grammar(random.Random(seed), 3)
    grammar = one_of(grammar)  # a grammar even where the draw was a literal
    parser = lark.Lark(f"start: {expr}", parser="earley", lexer="dynamic")
    pattern = re.compile(grammar.regex)
    assert grammar.matches_empty == empty
    for n in range(6):
        for letters in itertools.product("abc", repeat=n):
            text = "".join(letters)
            try:
                parser.parse(text)
                parsed = True
            except lark.exceptions.LarkError:
                parsed = False
            assert bool(pattern.fullmatch(text)) == parsed, (expr, text)


def test_json_accepts_only_documents_jsonschema_validates():
    grammar = json(Point)
    pattern = re.compile(grammar.regex)
    rng = random.Random(0)
    candidates = [
        f'{{"x":{rng.choice(["0", "7", "99", "100", "-1", "07", "1.0"])},'
        f'"y":{rng.choice(["3", "42", "-0", "x"])}}}'
        for _ in range(200)
    ]
    accepted = 0
    for text in candidates:
        try:
            jsonschema.validate(msgspec.json.decode(text), POINT_SCHEMA)
            valid = True
        except (jsonschema.ValidationError, msgspec.DecodeError):
            valid = False
        # Never looser than the schema; stricter only where it writes integers as such.
        if pattern.fullmatch(text):
            assert valid, text
            accepted += 1
        elif valid:
            assert '"x":1.0' in text, text
    assert 0 < accepted < len(candidates)


@pytest.mark.parametrize("text", ["abcab", "a b a", "xyz!", "aaaa"])
def test_substring_by_character_accepts_exactly_the_substrings(text):
    pattern = re.compile(substring(text, chunk="character").regex)
    alphabet = sorted(set(text)) + ["q"]
    for n in range(len(text) + 2):
        for letters in itertools.product(alphabet, repeat=n):
            candidate = "".join(letters)
            expected = bool(candidate) and candidate in text
            assert bool(pattern.fullmatch(candidate)) == expected, candidate


def test_substring_by_word_accepts_runs_of_whole_chunks():
    text = "Ana's tea, hot.  Then cake"
    chunks = re.findall(r"\w+|\s+|[^\w\s]+", text)
    runs = {"".join(chunks[i:j]) for i in range(len(chunks)) for j in range(i + 1, len(chunks) + 1)}
    pattern = re.compile(substring(text).regex)
    for i in range(len(text)):
        for j in range(i + 1, len(text) + 1):  # every substring: a run of chunks or not
            assert bool(pattern.fullmatch(text[i:j])) == (text[i:j] in runs), text[i:j]


def test_substring_stays_subquadratic_and_compiles_at_its_limit(vocab, feeds):
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [
        "".join(rng.choices(letters, k=rng.randint(2, 7))) for _ in range(MAX_SUBSTRING_CHUNKS // 2)
    ]
    text = " ".join(words) + "."  # words, the spaces between and the stop: the limit exactly
    assert len(re.findall(r"\w+|\s+|[^\w\s]+", text)) == MAX_SUBSTRING_CHUNKS
    grammar = substring(text)
    # The plain construction: about chunks^2 / 2 runs' worth of units (6+ characters each).
    assert len(grammar.regex) < MAX_SUBSTRING_CHUNKS**1.5 * 12
    engine_grammar = compile(Regex(grammar.regex), vocab)
    assert feeds(engine_grammar, " ".join(words[300:340]))
    assert feeds(engine_grammar, " ".join(words[-20:]) + ".")
    assert not feeds(engine_grammar, f"{words[1]} {words[3]}")
    with pytest.raises(ValueError, match=rf"{MAX_SUBSTRING_CHUNKS + 1} word chunks.*MAX_SUBSTRING"):
        substring(text + "x")
    # Python's parser recurses per nesting level (past ~400 it fails): the blocks keep the
    # regex of 500 chunks shallow.
    assert re.compile(substring("ab" * 250, chunk="character").regex)


def test_captures_are_the_pieces_the_text_was_built_from():
    grammar = (
        "Name: "
        + capture(regex("[A-Z][a-z]+"), "who")
        + optional(" (" + capture(regex("[0-9]+"), "age") + ")")
        + ": "
        + one_or_more(
            capture(one_of("tea", "jam"), "item")
            + optional("x" + capture(regex("[0-9]"), "n"))
            + ";"
        )
        + capture(json(Point), "at")
    )
    assert grammar.captures('Name: Ana (41): teax2;jam;tea;{"x":1,"y":2}') == {
        "who": "Ana",
        "age": "41",
        "item": ["tea", "jam", "tea"],
        "n": ["2"],  # only where it took part
        "at": Point(1, 2),  # a captured json(Type) comes back decoded
    }
    assert grammar.captures('Name: Bo: jam;{"x":0,"y":0}')["age"] is None


def test_captures_in_nested_repetitions_are_lists_of_lists():
    row = "[" + one_or_more(capture(regex("[0-9]+"), "cell") + ",") + "]"
    grammar = one_or_more(capture(regex("[a-z]"), "label") + row)
    text = "a[1,22,]b[3,]c[4,5,6,]"
    assert grammar.captures(text) == {
        "label": ["a", "b", "c"],
        "cell": [["1", "22"], ["3"], ["4", "5", "6"]],
    }
    # The same lists as rematching each piece with finditer, where the split is unambiguous.
    assert [m.group(1) for m in re.finditer(r"([a-z])\[", text)] == ["a", "b", "c"]


def test_an_ambiguous_repetition_gets_res_greedy_split():
    grammar = one_or_more(capture(regex("a+"), "run")) + "b"
    assert grammar.captures("aaab") == {"run": ["aaa"]}
    assert grammar.regex and re.fullmatch(grammar.regex, "aaab")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: capture("a", "x") + capture("b", "x"), "capture 'x' appears twice"),
        (lambda: one_of(capture("a", "x"), capture("b", "x")), "capture 'x' appears twice"),
        (lambda: capture(capture("a", "x"), "x"), "capture 'x' appears twice"),
        (lambda: one_or_more(optional("a")), "one_or_more: .* accepts the empty text"),
        (lambda: zero_or_more(regex("a*")), "zero_or_more: .* accepts the empty text"),
        (lambda: regex("(?P<n>a)"), "named groups are not captures here"),
        (lambda: regex("(?i)a"), "not a valid regex"),
        (lambda: regex("a)("), "not a valid regex"),
        (lambda: one_of(), "at least one option"),
        (lambda: capture("a", ""), "non-empty string"),
        (lambda: substring(""), "non-empty text"),
        (lambda: substring("abc", chunk="line"), "chunk must be"),
        (lambda: json({"type": "nonsense"}), r"json\(schema\): unknown 'type'"),
        (lambda: gen("x", grammar=capture("a", "x")), "capture of the grammar has the gen's"),
        (lambda: gen("x", grammar=one_of("a"), regex="b"), "cannot join regex or json_schema"),
        (lambda: gen("x", regex=one_of("a")), "a composed grammar goes in grammar="),
        (lambda: gen("x", grammar=one_of("a"), dtype=int), "dtype cannot be combined"),
    ],
)
def test_bad_compositions_fail_at_once_naming_the_problem(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_pieces_join_only_text_and_grammars(tokenizer):
    with pytest.raises(TypeError, match="cannot join"):
        one_of("a") + gen("x")
    with pytest.raises(TypeError, match="a grammar piece is text or a grammar"):
        one_or_more(3)

    @program
    def appended(s):
        s += "Q: " + one_of("a", "b")  # a constraint, not text: it goes in gen(grammar=...)

    with pytest.raises(TypeError, match="cannot append .* to a program state"):
        appended.run(backend=ScriptedBackend(tokenizer, []))


def test_a_rebuilt_grammar_writes_the_same_patterns():
    def build():
        return "n=" + one_or_more(capture(regex("[0-9]"), "d") + ";")

    assert build().regex == build().regex
    assert build()._named.pattern.pattern == build()._named.pattern.pattern


def test_the_names_are_exported_and_load_lazily():
    for name in ("capture", "json", "one_of", "one_or_more", "optional", "regex", "substring"):
        assert name in braid.__all__ and getattr(braid, name).__module__ == "braid.compose"
    assert braid.select is not braid.one_of  # scoring choices stays select's


# ---- gens with composed grammars ---------------------------------------------------------


class ScriptedBackend(ScriptedBase):
    """Each gen answers the next of `replies` ((text, finish reason)); records the params."""

    def __init__(self, tokenizer, replies) -> None:
        self.chat_template = ChatTemplate.from_tokenizer(tokenizer)
        self.replies, self.params = list(replies), []

    async def generate(self, prompt, params, on_text, lora=None, program=None):
        self.params.append(params)
        text, reason = self.replies.pop(0)
        on_text(text)
        return GenerateOutput(text, [1], reason, {"completion_tokens": 1})

    async def score(self, prefix, continuations, lora=None):
        raise AssertionError("no select here")


ORDER = (
    "Name: "
    + capture(regex("[A-Z][a-z]{1,6}"), "who")
    + "; items:"
    + one_or_more(" " + capture(one_of("tea", "cake", "jam"), "item"))
    + optional("; note: " + capture(substring("very hot please"), "note"))
    + "; at "
    + capture(json(Point), "at")
)


def test_a_gen_stores_its_text_and_each_capture(tokenizer):
    text = 'Name: Ana; items: tea jam tea; note: hot please; at {"x":3,"y":4}'
    backend = ScriptedBackend(tokenizer, [(text, "stop")])

    @program
    def p(s):
        s += "Order: " + gen("order", grammar=ORDER, max_tokens=60) + "\n"

    state = p.run(backend=backend)
    assert backend.params[0].regex == ORDER.regex and backend.params[0].grammar is None
    assert state["order"] == text and state.text() == f"Order: {text}\n"
    assert (state["who"], state["item"], state["note"]) == (
        "Ana",
        ["tea", "jam", "tea"],
        "hot please",
    )
    assert state["at"] == Point(3, 4)
    assert state.meta("who") is state.meta("order")  # a capture's meta is its gen's


def test_a_gen_cut_short_fails_its_state_and_sglang_keeps_the_text(tokenizer):
    cut = "Name: Ana; items: te"

    @program
    def p(s):
        s += gen("order", grammar=ORDER, max_tokens=8)

    with pytest.raises(ValueError, match=r"cannot decode .* does not match the grammar"):
        p.run(backend=ScriptedBackend(tokenizer, [(cut, "length")]))

    @braid.function
    def sgl(s):
        s += braid.gen("order", grammar=ORDER, max_tokens=8)

    kept = sgl.run(backend=ScriptedBackend(tokenizer, [(cut, "length")]))
    assert kept["order"] == cut and "who" not in kept


def test_a_composed_grammar_constrains_the_tiny_model(engine):
    # A random model may repeat an item until max_tokens: the tokens that leave the
    # repetition (";...") win wherever the grammar allows them, so every output ends.
    tokenizer = engine.tokenizer
    leave = {i: 100.0 for i in range(len(tokenizer)) if tokenizer.decode([i]).startswith(";")}

    @program
    def p(s, customer):
        s += f"Customer {customer}. "
        s += gen("order", grammar=ORDER, max_tokens=96, logit_bias=leave)

    backend = LocalBackend(engine)
    for seed, customer in enumerate(("Ana", "Bo", "Cy", "Di")):
        sampling = {"temperature": 1.0, "seed": seed}
        state = p.run(customer=customer, backend=backend, sampling=sampling)
        assert state.error is None, state.error
        text = state["order"]
        assert re.fullmatch(ORDER.regex, text)
        # The text is exactly what its captures rebuild (the json part checked by jsonschema).
        items = "".join(f" {item}" for item in state["item"])
        note = f"; note: {state['note']}" if state["note"] is not None else ""
        head = f"Name: {state['who']}; items:{items}{note}; at "
        assert text.startswith(head) and state["note"] in (None, *_runs("very hot please"))
        jsonschema.validate(msgspec.json.decode(text[len(head) :]), POINT_SCHEMA)
        assert msgspec.json.decode(text[len(head) :], type=Point) == state["at"]
        assert state.meta("order")["finish_reason"] == "stop"


def _runs(text: str) -> set[str]:
    chunks = re.findall(r"\w+|\s+|[^\w\s]+", text)
    return {"".join(chunks[i:j]) for i in range(len(chunks)) for j in range(i + 1, len(chunks) + 1)}
