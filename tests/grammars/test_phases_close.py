"""Documents that close through reasoning phases: near the end of its room a thought is
closed in time for the answer's shortest document, and the whitespace before the answer is
allowed only while the answer still fits."""

from __future__ import annotations

import pytest
import transformers

from braid import grammars
from braid.grammars.constraints import COMPACT
from braid.grammars.matcher import allocate_bitmask, allowed_token_ids
from braid.grammars.phases import PhasedMatcher, Phases, TokenClasses

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "boolean"}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tok(default_model_path):
    t = transformers.AutoTokenizer.from_pretrained(default_model_path)
    t.add_tokens(["<think>", "</think>"])
    return t


def _matcher(tok) -> tuple[PhasedMatcher, int]:
    vocab = grammars.build_vocabulary(tok, {tok.eos_token_id})
    grammar = grammars.compile(grammars.JsonSchema.of(SCHEMA, whitespace=COMPACT), vocab)
    [start] = tok.encode("<think>", add_special_tokens=False)
    [end] = tok.encode("</think>", add_special_tokens=False)
    phases = Phases("thinking", (start,), (end,), excluded=frozenset({tok.eos_token_id}))
    return PhasedMatcher(grammar.matcher(), phases, TokenClasses.of(vocab.token_bytes)), end


def test_the_thought_closes_in_time_for_the_answer(tok):
    m, end = _matcher(tok)
    shortest = m.inner.shortest_completion()  # {"answer":true}, in a few tokens
    assert 0 < shortest < len('{"answer":true}')
    for t in tok.encode(" Let me think.", add_special_tokens=False):
        assert m.accept_token(t)
    row = allocate_bitmask(1, len(tok))[0]
    # The end marker and the shortest answer fill the room exactly: only the marker.
    assert m.fill_bitmask_within(row, 1 + shortest)
    assert allowed_token_ids(row) == [end]
    # One token more: the thought may go on, unsteered.
    assert not m.fill_bitmask_within(row, 2 + shortest)
    assert len(allowed_token_ids(row)) > 1000
    # Too late for any answer: the thought's plain mask.
    assert not m.fill_bitmask_within(row, shortest)
    assert len(allowed_token_ids(row)) > 1000


def test_whitespace_before_the_answer_only_while_it_fits(tok):
    m, end = _matcher(tok)
    shortest = m.inner.shortest_completion()
    assert m.accept_token(end)
    [space] = tok.encode(" ", add_special_tokens=False)
    row = allocate_bitmask(1, len(tok))[0]
    assert not m.fill_bitmask_within(row, 1 + shortest)
    assert space in allowed_token_ids(row)
    assert m.fill_bitmask_within(row, shortest)
    assert space not in allowed_token_ids(row)
    assert allowed_token_ids(row)  # the answer's own first tokens
