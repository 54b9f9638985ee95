"""Token healing's masks and matcher (grammars/token_healing.py), checked against a scan of
the default model's vocabulary and against the inner grammars' own masks."""

from __future__ import annotations

import re

import pytest

from braid import grammars
from braid.grammars.matcher import allowed_token_ids
from braid.grammars.token_healing import HealingIndex, HealingMatcher


@pytest.fixture(scope="module")
def index(vocab) -> HealingIndex:
    return HealingIndex(vocab)


def _mask(matcher, size: int) -> set[int]:
    row = grammars.allocate_bitmask(1, size)[0]
    matcher.fill_bitmask(row)
    return set(allowed_token_ids(row))


@pytest.mark.parametrize("prefix", [b" ", b"\n", b" Par", b"ing", b"\xff"])
def test_extending_is_the_scan(index, vocab, prefix):
    scan = {i for i, b in enumerate(vocab.token_bytes) if b and b.startswith(prefix)}
    assert set(index.extending(prefix).tolist()) == scan


@pytest.mark.parametrize("removed", [b" ", b"ing", b" the"])
def test_unconstrained_first_mask(index, vocab, removed):
    """Allowed first: the tokens that start with the removed bytes, and those that spell a
    proper prefix of them; nothing else, and no EOS."""
    expected = {i for i, b in enumerate(vocab.token_bytes) if b and b.startswith(removed)}
    expected |= {
        i
        for i, b in enumerate(vocab.token_bytes)
        if b and len(b) < len(removed) and removed.startswith(b)
    }
    assert _mask(HealingMatcher(None, removed, index), vocab.size) == expected


def test_prefix_then_rest(index, vocab, tokenizer):
    """A token spelling part of the removed bytes leaves the rest to spell; rollback restores
    the state before it."""
    m = HealingMatcher(None, b"ing", index)
    [i_tok] = tokenizer.encode("i", add_special_tokens=False)
    assert m.accept_token(i_tok) and m.rest == b"ng"
    after = _mask(m, vocab.size)
    assert after and all(
        vocab.token_bytes[t].startswith(b"ng") or b"ng".startswith(vocab.token_bytes[t])
        for t in after
    )
    m.rollback(1)
    assert m.rest == b"ing"
    [word] = tokenizer.encode(" thing", add_special_tokens=False)[-1:]
    assert not m.accept_token(word)  # " thing" does not start with "ing"


def test_healing_token_then_free(index, vocab, tokenizer):
    m = HealingMatcher(None, b" ", index)
    [paris] = tokenizer.encode(" Paris", add_special_tokens=False)
    assert m.accept_token(paris) and not m.healing
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    row.zero_()
    m.fill_bitmask(row)
    assert bool((row == -1).all())  # as an unconstrained row
    m.rollback(1)
    assert m.healing and m.rest == b" "


@pytest.mark.parametrize(
    "constraint, removed",
    [
        (grammars.Regex(r"[0-9]{2,4} apples"), b" "),  # no " 1" token: only " " itself
        (grammars.Regex(r"(Paris|Lyon)\."), b" "),
        (
            grammars.JsonSchema.of({"type": "object", "properties": {"a": {"type": "integer"}}}),
            b" ",
        ),
        (grammars.Choices(("yes", "no")), b" "),
        (grammars.Choices(("yes", "no")), b"\n"),
    ],
)
def test_constrained_first_mask_is_the_scan(index, vocab, tokenizer, constraint, removed):
    """Under a grammar a first token p + r is allowed iff the grammar takes r as a prefix:
    checked against feeding each candidate's r through a fresh matcher of the grammar."""
    grammar = grammars.compile(constraint, tokenizer)
    got = _mask(HealingMatcher(grammar.matcher(), removed, index), vocab.size)
    expected = set()
    for t, b in enumerate(vocab.token_bytes):
        if not b:
            continue
        if b.startswith(removed):
            tail = b[len(removed) :]
            spelled = index.spell(tail)
            inner = grammar.matcher()
            if not tail or (spelled and grammars.matcher.accept_all(inner, spelled)):
                expected.add(t)
        elif len(b) < len(removed) and removed.startswith(b):
            expected.add(t)
    assert got == expected
    assert removed in [vocab.token_bytes[t] for t in got]  # re-spelling p is always allowed


def test_constrained_text_after_healing(index, vocab, tokenizer):
    """After a healing token the inner grammar stands where its text after p leaves it, and
    the whole output (p stripped) is a sentence of the grammar."""
    pattern = r"(Paris|Lyon) has [0-9]{2} apples"
    grammar = grammars.compile(grammars.Regex(pattern), tokenizer)
    m = HealingMatcher(grammar.matcher(), b" ", index)
    [token] = tokenizer.encode(" Paris", add_special_tokens=False)
    assert token in _mask(m, vocab.size)
    assert m.accept_token(token)
    text = vocab.token_bytes[token][1:]
    while not m.is_terminated():
        allowed = sorted(_mask(m, vocab.size))
        nxt = (
            next(t for t in allowed if t not in vocab.eos_token_ids)
            if len(allowed) > 1
            else allowed[0]
        )
        if nxt in vocab.eos_token_ids:
            assert m.accept_token(nxt)
            break
        assert m.accept_token(nxt)
        text += vocab.token_bytes[nxt]
    assert re.fullmatch(pattern, text.decode())


def test_heals_only_text_tokens(index, tokenizer):
    ids = tokenizer.encode("The capital of France is ", add_special_tokens=False)
    assert index.heals(ids) == b" "
    assert index.heals(ids[-1:]) == b""  # the prompt's only token
    assert index.heals([*ids, tokenizer.eos_token_id]) == b""  # a special token
