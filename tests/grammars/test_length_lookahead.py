"""JSON-schema strings with a pattern (or format) and length bounds: the regex's length
lookahead `(?=C{m,n}")(X)"`, compiled by the lazy automaton as an intersection.

Masks are checked token by token against an independent automaton (interegular's FSM of the
pattern intersected with the lengths), random walks must validate with jsonschema, and
strings of the pattern get through exactly when their length is within the bounds."""

from __future__ import annotations

import json
import random

import interegular
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from braid import grammars
from braid.grammars.matcher import allowed_token_ids
from braid.grammars.regex.lazy import LazyRegexGrammar

# (ECMA pattern, also Python's, anchored; minLength; maxLength or None)
CASES = [
    (r"^(ab|cde)+$", 5, 9),
    (r"^[a-c]+-[0-9]+$", 4, 8),
    (r"^(xy)*z?$", 3, None),
    (r"^([a-z0-9-]+):([a-z0-9.-]+):([a-z0-9-]+)?:([a-z0-9-]+)$", 0, 16),
    # Bounds past the longest token (81 bytes), where copies of the pattern share masks;
    # after "e" and after "ab" the same node is reached with lengths of another phase.
    (r"^(e|ab)(fff)*(g|hi)?$", 100, 160),
    (r"^(e|ab)(fff)*(g|hi)?$", 100, None),
    (r"^(ab|cde)+$", 150, 400),
]
IDS = [f"{p}-{lo}-{hi}" for p, lo, hi in CASES]


def _schema(pattern: str, lo: int, hi: int | None) -> dict:
    schema = {"type": "string", "pattern": pattern, "minLength": lo}
    return schema if hi is None else {**schema, "maxLength": hi}


def _grammar(vocab, pattern: str, lo: int, hi: int | None):
    grammar = grammars.compile(grammars.JsonSchema.of(_schema(pattern, lo, hi)), vocab)
    assert isinstance(grammar, LazyRegexGrammar) and "(?=" in grammar.source
    return grammar


class Oracle:
    """Which ASCII tokens may follow a content prefix, from interegular's FSM of the pattern
    intersected with the length bounds (a JSON string's content, closed by a quote)."""

    def __init__(self, vocab, pattern: str, lo: int, hi: int | None) -> None:
        body = pattern.strip("^$")
        lengths = interegular.parse_pattern(f"[ -~]{{{lo},{'' if hi is None else hi}}}")
        own = interegular.parse_pattern(body).to_fsm()
        self.fsm = own & lengths.to_fsm()
        self.ascii = {
            i: b.decode()
            for i, b in enumerate(vocab.token_bytes)
            if b and all(0x20 <= x < 0x7F for x in b)
        }
        # Tokens of the pattern's characters (and a closing quote): all others are refused.
        chars = {c for c in own.alphabet if isinstance(c, str)}
        self.tokens = {i: t for i, t in self.ascii.items() if set(t.removesuffix('"')) <= chars}

    def state(self, text: str):
        s = self.fsm.initial
        for c in text:
            s = self.fsm.map.get(s, {}).get(self.fsm.alphabet[c])
            if s is None:
                return None
        return s

    def allowed(self, content: str) -> set[int]:
        out = set()
        for token_id, text in self.tokens.items():
            body, quote, rest = text.partition('"')
            s = self.state(content + body)
            if s is None:
                continue
            if quote and not rest and s in self.fsm.finals:
                out.add(token_id)
            elif not quote and self.fsm.islive(s):
                out.add(token_id)
        return out


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_masks_are_the_intersection(case, vocab):
    grammar = _grammar(vocab, *case)
    oracle = Oracle(vocab, *case)
    quote = vocab.token_bytes.index(b'"')
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    rng = random.Random(0)
    for _ in range(3):
        matcher = grammar.matcher()
        assert matcher.accept_token(quote)
        content = ""
        for _ in range(250):
            matcher.fill_bitmask(row)
            allowed = {t for t in allowed_token_ids(row) if t in oracle.ascii}
            assert allowed == oracle.allowed(content), f"after {content!r}"
            open_tokens = [t for t in allowed if '"' not in oracle.tokens[t]]
            if not open_tokens:
                break
            token = rng.choice(open_tokens)
            assert matcher.accept_token(token)
            content += oracle.tokens[token]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_walks_validate(case, vocab):
    grammar = _grammar(vocab, *case)
    schema = _schema(*case)
    eos = min(vocab.eos_token_ids)
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    rng = random.Random(1)
    for _ in range(20):
        matcher, out = grammar.matcher(), b""
        while True:
            matcher.fill_bitmask(row)
            allowed = allowed_token_ids(row)
            assert allowed, f"dead end after {out!r}"
            if eos in allowed:
                break
            token = rng.choice(allowed)  # runs to the maximum length as often as not
            assert matcher.accept_token(token)
            out += vocab.token_bytes[token]
        jsonschema.validate(json.loads(out), schema)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_pattern_strings_pass_exactly_within_the_lengths(case, vocab, feeds, data):
    pattern, lo, hi = case
    grammar = _grammar(vocab, *case)
    alphabet = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
    text = data.draw(st.from_regex(pattern, fullmatch=True, alphabet=alphabet))
    fits = lo <= len(text) and (hi is None or len(text) <= hi)
    assert feeds(grammar, json.dumps(text)) == fits, text
