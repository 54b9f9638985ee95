"""EBNF (lark) grammars against lark itself: what the masks let through must parse, what
lark parses must get through the masks token by token, and errors name the problem."""

from __future__ import annotations

import codecs
import random

import lark
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from braid import grammars
from braid.grammars.matcher import allowed_token_ids

JSON = r"""
start: value
?value: object | array | string | SIGNED_NUMBER -> number
      | "true" -> true | "false" -> false | "null" -> null
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""

ARITHMETIC = r"""
start: expr
?expr: expr ("+" | "-") term | term
?term: term ("*" | "/") factor | factor
?factor: NUMBER | "-" factor | "(" expr ")"
NUMBER: /[0-9]+(\.[0-9]+)?/
%ignore " "
"""

SQL = r"""
start: "SELECT"i columns "FROM"i NAME [where] [limit] ";"?
columns: "*" | NAME ("," NAME)*
where: "WHERE"i condition ("AND"i condition)*
condition: NAME OP value
limit: "LIMIT"i INT
value: INT | STRING
OP: "=" | "!=" | "<" | ">" | "<=" | ">="
NAME: /[a-z_][a-z0-9_]*/
STRING: /'[^']*'/
%import common.INT
%import common.WS
%ignore WS
"""

GRAMMARS = {"json": JSON, "arithmetic": ARITHMETIC, "sql": SQL}

EXAMPLES = {
    "json": [
        '{"a": [1, -2.5e3, {"b": null}], "c": "x\\"y", "d": true}',
        "[]",
        '  "caf\u00e9 \u2014 \U0001f600"  ',
        '{"nested": {"deeper": [[], [false, "\\\\"]]}}',
    ],
    "arithmetic": ["1 + 2*(3-4.5)/-6", "(((7)))", "--1", "10 / 3 * 2 - 0.25"],
    "sql": [
        "SELECT * FROM users;",
        "select name, age from people where age >= 18 and name = 'bob' limit 10",
        "SELECT selected FROM fromage",
        "SELECT a FROM t WHERE s = 'it has spaces, and commas'",
    ],
}

INVALID = {
    "json": ['{"a" 1}', "[1,]", '{"a": tru}', "[1 2]"],
    "arithmetic": ["1 +", "(2", "3 4", "*5"],
    "sql": ["SELECT FROM t", "SELECT a FROM", "SELECT a FROM t LIMIT x", "DELETE FROM t"],
}


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_lark_sentences_pass_the_masks(name, feeds, vocab):
    grammar = grammars.compile(grammars.Ebnf(GRAMMARS[name]), vocab)
    parser = lark.Lark(GRAMMARS[name], parser="lalr")
    for text in EXAMPLES[name]:
        parser.parse(text)
        assert feeds(grammar, text), text
    for text in INVALID[name]:
        with pytest.raises(lark.exceptions.LarkError):
            parser.parse(text)
        assert not feeds(grammar, text), text


def _walk(grammar, rng: random.Random, max_steps: int = 120) -> bytes | None:
    """A random walk over the masks, steered towards the end after a while; None if it
    did not end within max_steps."""
    vocab = grammar.vocab
    eos = min(vocab.eos_token_ids)
    matcher = grammar.matcher()
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    out = b""
    for step in range(max_steps):
        matcher.fill_bitmask(row)
        allowed = allowed_token_ids(row)
        assert allowed, f"dead end after {out!r}"
        if eos in allowed and (step > 15 or rng.random() < 0.3):
            assert matcher.accept_token(eos) and matcher.is_terminated()
            return out
        tokens = [t for t in allowed if t != eos]
        if step > 25:  # prefer what closes: digits, quotes, brackets, short tokens
            closing = [t for t in tokens if set(vocab.token_bytes[t]) & set(b"0123456789\"')]}")]
            tokens = sorted(closing or tokens, key=lambda t: len(vocab.token_bytes[t]))[:50]
        token = rng.choice(tokens)
        assert matcher.accept_token(token)
        out += vocab.token_bytes[token]
    return None


@pytest.mark.parametrize("name", sorted(GRAMMARS))
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_walks_parse_with_lark(name, vocab, seed):
    grammar = grammars.compile(grammars.Ebnf(GRAMMARS[name]), vocab)
    out = _walk(grammar, random.Random(seed))
    if out is not None:
        lark.Lark(GRAMMARS[name], parser="lalr").parse(out.decode("utf-8"))


def test_walks_do_end(vocab):
    grammar = grammars.compile(grammars.Ebnf(JSON), vocab)
    ended = [_walk(grammar, random.Random(seed)) for seed in range(6)]
    assert sum(out is not None for out in ended) >= 3


def test_rollback_restores_masks(check_rollback, vocab):
    check_rollback(grammars.compile(grammars.Ebnf(JSON), vocab), '{"key": [1, 2')


def test_jump_forward_text(tokenizer, vocab):
    grammar = grammars.compile(
        grammars.Ebnf('start: "{\\"name\\": " ESCAPED_STRING ", \\"n\\": " INT "}"\n'
                      "%import common.ESCAPED_STRING\n%import common.INT"),
        vocab,
    )  # fmt: skip
    matcher = grammar.matcher()
    assert matcher.jump_forward() == '{"name": "'
    for token in tokenizer.encode('{"name": "Ada"', add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.jump_forward() == ', "n": '
    for token in tokenizer.encode(', "n": 7', add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.jump_forward() == ""  # 7 may go on: 71, 712, ...
    assert matcher.accept_token(tokenizer.encode("}", add_special_tokens=False)[0])
    assert matcher.is_terminated()


def test_eos_only_where_the_grammar_accepts(tokenizer, vocab):
    grammar = grammars.compile(grammars.Ebnf(ARITHMETIC), vocab)
    eos = tokenizer.eos_token_id
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    matcher = grammar.matcher()
    for text, complete in (("1", True), (" +", False), (" (2", False), (")", True)):
        for token in tokenizer.encode(text, add_special_tokens=False):
            assert matcher.accept_token(token)
        matcher.fill_bitmask(row)
        assert (eos in allowed_token_ids(row)) == complete, text


@pytest.mark.parametrize(
    "text, message",
    [
        ("start: undefined_rule", "undefined_rule"),
        ('start: ("a"', "invalid EBNF grammar"),
        ('start: a | b\na: "x"\nb: "x"', "Reduce/Reduce"),
        ("start: WORD\nWORD: /a(?=b)/", "lookarounds"),
        ('start: EMPTY "a"\nEMPTY: /b*/', "zero-width"),
    ],
)
def test_bad_grammars_are_named(text, message, vocab):
    with pytest.raises(ValueError, match=message):
        grammars.compile(grammars.Ebnf(text), vocab)


def test_inside_a_string_every_allowed_token_can_continue_as_utf8(vocab):
    """A token ending inside a character must end on a prefix some character has: after a
    lead byte 0xF0, a token starting 0x83 (a second byte no code point takes) was let
    through, and the walk above then met a mask with nothing in it."""
    grammar = grammars.compile(grammars.Ebnf(GRAMMARS["json"]), vocab)
    leads = [t for t, b in enumerate(vocab.token_bytes) if b and b[-1:] in (b"\xf0", b"\xe0")]
    assert leads
    for lead in leads[:4]:
        matcher = grammar.matcher()
        assert matcher.accept_token(vocab.token_bytes.index(b'"'))
        if not matcher.accept_token(lead):
            continue
        row = grammars.allocate_bitmask(1, vocab.size)[0]
        matcher.fill_bitmask(row)
        for token in allowed_token_ids(row):
            text = vocab.token_bytes[lead] + (vocab.token_bytes[token] or b"")
            codecs.getincrementaldecoder("utf-8")().decode(text, final=False)  # raises if not
