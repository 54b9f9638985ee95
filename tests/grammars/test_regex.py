"""Regex and choices grammars against Python's `re`: every string the regex matches gets
through the masks token by token, every walk over the masks writes a string it matches.
Both backends: the outlines index and the lazy automaton (grammars/regex/lazy.py), whose masks
must also be the index's, bit for bit."""

from __future__ import annotations

import random
import re
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from braid import grammars
from braid.grammars.json_schema.convert import schema_to_regex
from braid.grammars.matcher import allowed_token_ids
from braid.grammars.regex import lazy as lazy_module
from braid.grammars.regex.grammar import RegexGrammar
from braid.grammars.regex.lazy import LazyRegexGrammar
from braid.grammars.regex.outlines_index import build_index

# In the common subset of Python's and Rust's regex syntax (Rust's \d is Unicode: [0-9]).
PATTERNS = [
    r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    r"[a-z]{1,8}(-[a-z]{1,8}){0,3}",
    r"(yes|no|maybe)( because [a-z ]{1,20})?",
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"-?(0|[1-9][0-9]{0,5})(\.[0-9]{1,4})?",
    r"[A-Z][a-zé]{0,6}( [A-Z][a-zé]{0,6}){0,2}",
]
BACKENDS = pytest.mark.parametrize("backend", ["index", "lazy"])


def compile_regex(pattern: str, vocab, backend: str):
    if backend == "lazy":
        return LazyRegexGrammar(pattern, vocab)
    return RegexGrammar(build_index(pattern, vocab), vocab, pattern)


SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def walk(grammar, rng: random.Random, max_steps: int = 80) -> str | None:
    vocab = grammar.vocab
    eos = min(vocab.eos_token_ids)
    matcher = grammar.matcher()
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    out = b""
    for _ in range(max_steps):
        matcher.fill_bitmask(row)
        allowed = allowed_token_ids(row)
        assert allowed, f"dead end after {out!r}"
        if eos in allowed and (len(allowed) == 1 or rng.random() < 0.3):
            assert matcher.accept_token(eos)
            return out.decode("utf-8")
        token = rng.choice([t for t in allowed if t != eos])
        assert matcher.accept_token(token)
        out += vocab.token_bytes[token]
    return None


@BACKENDS
@pytest.mark.parametrize("pattern", PATTERNS)
@SETTINGS
@given(data=st.data())
def test_every_match_gets_through(pattern, backend, feeds, vocab, data):
    grammar = compile_regex(pattern, vocab, backend)
    text = data.draw(st.from_regex(pattern, fullmatch=True))
    assert feeds(grammar, text), text


@BACKENDS
@pytest.mark.parametrize("pattern", PATTERNS)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_walks_match(pattern, backend, vocab, seed):
    grammar = compile_regex(pattern, vocab, backend)
    out = walk(grammar, random.Random(seed))
    # Every pattern is far shorter than the walk's 80 tokens: it must have ended.
    assert out is not None, "the walk did not end"
    assert re.fullmatch(pattern, out), out


@BACKENDS
@pytest.mark.parametrize("pattern", PATTERNS[:3])
def test_non_matches_are_refused(pattern, backend, feeds, vocab):
    grammar = compile_regex(pattern, vocab, backend)
    for text in ("(555) 12-3456", "Abc", "yes because", "x" * 30, ""):
        if not re.fullmatch(pattern, text):
            assert not feeds(grammar, text), text


@SETTINGS
@given(
    value=st.one_of(
        st.integers(-(10**12), 10**12),
        st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(),
    )
)
def test_dtype_regexes_take_python_values(value, feeds, vocab):
    constraint = grammars.dtype_constraint(type(value))
    assert re.fullmatch(constraint.pattern, repr(value))
    assert feeds(grammars.compile(constraint, vocab), repr(value))


def test_choices_reach_every_option(feeds, vocab):
    options = ("a", "ab", "abc", "b", "naïve", "New York")
    grammar = grammars.compile(grammars.Choices(options), vocab)
    for option in options:
        assert feeds(grammar, option), option
    for other in ("abcd", "c", "New"):
        assert not feeds(grammar, other), other


@BACKENDS
def test_rollback_restores_masks(check_rollback, vocab, backend):
    check_rollback(compile_regex(PATTERNS[0], vocab, backend), "(555) 867-5309")


@BACKENDS
def test_jump_forward_is_the_forced_text(tokenizer, vocab, backend):
    grammar = compile_regex(r'\{"id": [0-9]+, "ok": (true|false)\}', vocab, backend)
    matcher = grammar.matcher()
    assert matcher.jump_forward() == '{"id": '
    for token in tokenizer.encode('{"id": 42', add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.jump_forward() == ""  # more digits or the comma
    for token in tokenizer.encode(', "ok": t', add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.jump_forward() == "rue}"


@pytest.mark.parametrize(
    "pattern, message",
    [("(unclosed", "invalid regex"), ("[z-a]", "invalid regex"), (r"a[^\s\S]", "matches nothing")],
)
def test_bad_regexes_are_named(pattern, message, vocab):
    with pytest.raises(ValueError, match=re.escape(message)):
        grammars.compile(grammars.Regex(pattern), vocab)
    # The same through the lazy automaton, which takes regexes too large for an index.
    long = f"(?:{pattern})" + "[a-z]{600}"
    with pytest.raises(ValueError, match=re.escape(message)):
        grammars.compile(grammars.Regex(long), vocab)


def test_deep_nesting_is_refused_not_a_crash(vocab):
    """Parsing and compiling recurse per nesting level on the calling thread's stack: past
    the limit the regex is refused (30,000 levels used to overflow a thread's stack)."""
    failures = []

    def build(pattern: str) -> None:
        try:
            LazyRegexGrammar(pattern, vocab)
        except ValueError as e:
            failures.append(str(e))

    for pattern in ["(" * 30_000 + "a" + ")" * 30_000, "a" + "{1}" * 30_000]:
        thread = threading.Thread(target=build, args=(pattern,))  # as the compile thread
        thread.start()
        thread.join()
    assert len(failures) == 2 and all("nests deeper than 2000" in f for f in failures)
    assert (
        LazyRegexGrammar("(" * 1500 + "a" + ")" * 1500, vocab)
        .matcher()
        .accept_token(vocab.token_bytes.index(b"a"))
    )


def test_compiler_limits_time_and_keeps_working(vocab):
    # Two thousand constants in a oneOf: proving them pairwise exclusive runs for seconds.
    slow = grammars.JsonSchema.of({"oneOf": [{"const": i} for i in range(2000)]})
    compiler = grammars.GrammarCompiler(vocab, timeout_s=0.5)
    try:
        with pytest.raises(ValueError, match="grammar_compile_timeout_s"):
            compiler.submit(slow).result()
        quick = grammars.Regex("[0-9]{2}")
        first, again = compiler.submit(quick), compiler.submit(quick)
        assert first.result() is again.result()  # one compile for both
        assert first.result().matcher().accept_token(vocab.token_bytes.index(b"4"))
    finally:
        compiler.close()


def test_the_lazy_automaton_serves_and_an_index_only_without_it(vocab, feeds, monkeypatch):
    # 40 counted JSON characters: an index of them takes seconds, the lazy automaton none.
    counted = grammars.Regex(r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,40}"')
    compiler = grammars.GrammarCompiler(vocab, timeout_s=5)
    try:
        grammar = compiler.submit(counted).result()
        assert isinstance(grammar, LazyRegexGrammar)
        assert feeds(grammar, '"caf\\u00e9 \\"ok\\""')
        assert not feeds(grammar, '"' + "x" * 41 + '"')
        # Without the lazy automaton's library the worker builds an outlines index.
        monkeypatch.setattr(lazy_module, "lazy_available", lambda: False)
        grammar = compiler.submit(grammars.Regex("[0-9]{2}")).result()
        assert isinstance(grammar, RegexGrammar) and feeds(grammar, "42")
    finally:
        compiler.close()


# A JSON schema's regex: what compiling now sends to the lazy automaton instead of an index.
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True},
        "when": {"type": "string", "format": "date"},
    },
    "required": ["id"],
}
SCHEMA_TEXT = '{"id":12,"tags":["b","a"],"when":"2024-02-29"}'


@pytest.mark.parametrize(
    "pattern",
    [*PATTERNS, r'"([^"\\\x00-\x1f]|\\["\\/bfnrt])*"', r"(a|ab)(c|bcd)(d*)", r"[^a-c\n]+[\d]",
     schema_to_regex(SCHEMA), r"[ \n\t]{0,20}\{[ \n\t]{0,20}\}", r"[a-c\té€]+"],
)  # fmt: skip
def test_lazy_masks_are_the_index_masks(pattern, vocab, tokenizer):
    """Along a matching text, the lazy automaton allows exactly the index's tokens."""
    index, lazy = compile_regex(pattern, vocab, "index"), compile_regex(pattern, vocab, "lazy")
    text = next(
        t for t in ["(555) 867-5309", "abc-de", "maybe because x", "2024-02-29", "-12.5",
                    "Ab Cé", '"a\\"b"', "abcd", "xyz4", SCHEMA_TEXT, " {\n  }", "aé€\tb"]
        if re.fullmatch(pattern, t)
    )  # fmt: skip
    rows = grammars.allocate_bitmask(2, vocab.size)
    matchers = [index.matcher(), lazy.matcher()]
    ids = tokenizer.encode(text, add_special_tokens=False)
    for i in range(len(ids) + 1):
        for m, row in zip(matchers, rows, strict=True):
            m.fill_bitmask(row)
        assert torch.equal(rows[0], rows[1]), f"masks differ after {tokenizer.decode(ids[:i])!r}"
        if i < len(ids):
            assert all(m.accept_token(ids[i]) for m in matchers)
