"""EBNF terminals whose character classes reach past their alphabet: interegular's
"anything else" stands for the characters a class does not list, which is none for a class
that excludes every code point and some multi-byte ones for one that excludes the BMP. The
masks take partial UTF-8 tokens only where such a character can finish them, a terminal that
can match no text is refused when the grammar compiles, and all of it holds for a grammar
that came back pickled from a compile worker (interegular's marker for those characters is
compared by identity, which pickling does not keep)."""

from __future__ import annotations

import pytest

from braid import grammars
from braid.grammars.ebnf.lexer import build_terminal
from braid.grammars.matcher import allowed_token_ids

NOT_A = "start: X+\nX: /[^a]/\n"
ASTRAL = "start: X+\nX: /[^\\x00-\\uffff]/\n"  # a character past the BMP, 4 UTF-8 bytes


def _allowed(matcher, vocab) -> set[int]:
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    matcher.fill_bitmask(row)
    return set(allowed_token_ids(row))


def _byte_token(vocab, data: bytes) -> int:
    return vocab.token_bytes.index(data)


@pytest.fixture(scope="module")
def worker(vocab):
    """A compiler whose grammars are built in its worker process and pickled back."""
    # lark's own collision check takes seconds over a class of every code point: more time
    # than the default limit leaves on a loaded machine.
    compiler = grammars.GrammarCompiler(vocab, workers=1, timeout_s=120)
    yield lambda text: compiler.submit(grammars.Ebnf(text)).result()
    compiler.close()


@pytest.mark.parametrize(
    "terminal",
    [
        # A class of every code point takes lark seconds to check (the worker test below
        # runs one in the suite).
        pytest.param("[^\\x00-\\U0010FFFF]", marks=pytest.mark.slow),  # no code point
        pytest.param("a[^\\x00-\\U0010FFFF]+", marks=pytest.mark.slow),  # none after the a
        "[\\ud800-\\udfff]",  # surrogates: no UTF-8 text holds one
        pytest.param(
            "(a[\\ud800-\\udfff]|[^\\x00-\\U0010FFFF])?b[\\udc00]", marks=pytest.mark.slow
        ),
    ],
)
def test_a_terminal_that_matches_no_text_is_refused_at_compile(vocab, terminal):
    with pytest.raises(ValueError, match="EBNF terminal X: .*matches no text"):
        grammars.compile(grammars.Ebnf(f"start: X\nX: /{terminal}/\n"), vocab)


def test_a_class_that_excludes_every_code_point_is_refused_before_its_automaton():
    """interegular takes half a minute to build that automaton (its alphabet lists every code
    point); the class is seen in the parsed pattern, and named printably."""
    with pytest.raises(ValueError, match=r"EBNF terminal X: regex /\[\^\\x00-\\U0010ffff\]/"):
        build_terminal("X", "[^\x00-\U0010ffff]", 0, False)


def test_the_refusal_comes_back_from_the_worker(worker):
    with pytest.raises(ValueError, match="EBNF terminal X: .*matches no text"):
        worker("start: X\nX: /[^\\x00-\\U0010FFFF]/\n")


@pytest.mark.parametrize("where", ["here", "worker"])
def test_a_negated_class_takes_a_multibyte_character_byte_by_byte(vocab, worker, where):
    """/[^a]/ takes "é" as its two byte tokens and any character not yet seen (the worker's
    memo holds only the first mask's steps), refuses "a", and jump-forward forces nothing."""
    grammar = grammars.compile(grammars.Ebnf(NOT_A), vocab) if where == "here" else worker(NOT_A)
    matcher = grammar.matcher()
    assert matcher.jump_forward() == ""
    assert _byte_token(vocab, b"a") not in _allowed(matcher, vocab)
    for byte in "é".encode():
        token = _byte_token(vocab, bytes([byte]))
        assert token in _allowed(matcher, vocab)
        assert matcher.accept_token(token)
        assert matcher.jump_forward() == ""
    for ch in "\U0001d11e\u4e2d":  # 4 and 3 bytes
        for byte in ch.encode():
            assert matcher.accept_token(_byte_token(vocab, bytes([byte]))), ch


@pytest.mark.parametrize("where", ["here", "worker"])
def test_past_the_bmp_only_astral_leads_are_allowed(vocab, worker, where):
    """A class excluding the BMP: a token ending in a 2- or 3-byte lead can lead nowhere
    (every such character is in the class's alphabet and refused), a 4-byte lead can."""
    grammar = grammars.compile(grammars.Ebnf(ASTRAL), vocab) if where == "here" else worker(ASTRAL)
    matcher = grammar.matcher()
    allowed = _allowed(matcher, vocab)
    assert _byte_token(vocab, b"\xf0") in allowed
    for lead in (b"\xc3", b"\xe4", b"a"):
        assert _byte_token(vocab, lead) not in allowed, lead
    for token in allowed:  # every allowed token can still be finished
        data = vocab.token_bytes[token]
        if data and data[-1] >= 0xC0:
            assert data[-1] >= 0xF0, data
    for byte in "\U0001f600".encode():
        assert matcher.accept_token(_byte_token(vocab, bytes([byte])))


def test_a_branch_that_needs_a_surrogate_is_dead(vocab):
    """/a[\\ud800-\\udfff]|b/: the a can never be followed, so only b is allowed; and a class
    that lists a surrogate beside é still takes é's partial bytes."""
    grammar = grammars.compile(grammars.Ebnf("start: X\nX: /a[\\ud800-\\udfff]|b/\n"), vocab)
    allowed = _allowed(grammar.matcher(), vocab)
    assert _byte_token(vocab, b"b") in allowed and _byte_token(vocab, b"a") not in allowed
    grammar = grammars.compile(grammars.Ebnf("start: X\nX: /[\\ud800\\u00e9]+/\n"), vocab)
    matcher = grammar.matcher()
    assert matcher.accept_token(_byte_token(vocab, b"\xc3"))
    assert _allowed(matcher, vocab) >= {_byte_token(vocab, b"\xa9")}
