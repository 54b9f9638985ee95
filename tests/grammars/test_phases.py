"""A reasoning request's grammar in phases (grammars/phases.py), fed token by token: the mask
of each phase, the switch on the end marker (one token or several), budgets, the answer
header a format forces, and rollback across the switch. The default tokenizer with the think
tags added as tokens stands in for a reasoning model's."""

from __future__ import annotations

import json

import jsonschema
import pytest
import transformers

from braid import grammars
from braid.grammars.constraints import COMPACT
from braid.grammars.matcher import allocate_bitmask, allowed_token_ids
from braid.grammars.phases import (
    LEAD_SPACES,
    FreeMatcher,
    MarkerGuard,
    PhasedMatcher,
    Phases,
    TokenClasses,
)

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "boolean"}},
    "required": ["answer"],
    "additionalProperties": False,
}
THOUGHT = "\nI should say yes, since the question asks it.\n"
ANSWER = '{"answer":true}'


@pytest.fixture(scope="module")
def tok(default_model_path):
    t = transformers.AutoTokenizer.from_pretrained(default_model_path)
    t.add_tokens(["<think>", "</think>", "<tool_call>"])
    return t


@pytest.fixture(scope="module")
def vocab(tok):
    return grammars.build_vocabulary(tok, {tok.eos_token_id})


@pytest.fixture(scope="module")
def classes(vocab):
    return TokenClasses.of(vocab.token_bytes)


@pytest.fixture(scope="module")
def schema_grammar(vocab):
    # Compact: the whitespace before the answer is the phases' own (bounded), none of the
    # answer's grammar.
    return grammars.compile(grammars.JsonSchema.of(SCHEMA, whitespace=COMPACT), vocab)


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def one(tok, text: str) -> int:
    [t] = ids(tok, text)
    return t


def plan(tok, opening: str, **fields) -> Phases:
    return Phases(
        opening,
        (one(tok, "<think>"),),
        (one(tok, "</think>"),),
        excluded=frozenset({tok.eos_token_id}),
        **fields,
    )


def allowed(matcher, size: int) -> set[int]:
    row = allocate_bitmask(1, size)[0]
    matcher.fill_bitmask(row)
    return set(allowed_token_ids(row))


def feed(matcher, tokens: list[int], size: int) -> list[set[int]]:
    """Each token checked against the mask before it, then accepted; the masks seen."""
    masks = []
    for t in tokens:
        masks.append(allowed(matcher, size))
        assert t in masks[-1], f"token {t} is masked"
        assert matcher.accept_token(t)
    return masks


def test_a_thought_then_an_answer_held_to_the_schema(tok, vocab, classes, schema_grammar):
    m = PhasedMatcher(schema_grammar.matcher(), plan(tok, "maybe"), classes)
    first = allowed(m, vocab.size)
    assert one(tok, "<think>") in first and one(tok, "{") in first  # think, or answer at once
    assert one(tok, "}") not in first and tok.eos_token_id not in first
    thought = ids(tok, "<think>" + THOUGHT)
    masks = feed(m, thought, vocab.size)
    assert all(tok.eos_token_id not in mask for mask in masks[1:])  # no EOS inside a thought
    assert one(tok, "}") in masks[-1]  # a thought is free text
    feed(m, [one(tok, "</think>")], vocab.size)
    assert m.in_answer and m.reasoning_tokens == len(thought) + 1
    lead = allowed(m, vocab.size)
    assert one(tok, "\n\n") in lead and one(tok, "{") in lead and one(tok, "}") not in lead
    answer = ids(tok, "\n\n" + ANSWER)
    feed(m, answer, vocab.size)
    assert allowed(m, vocab.size) == {tok.eos_token_id}
    jsonschema.validate(json.loads(tok.decode(answer)), SCHEMA)


def test_whitespace_before_the_answer_is_bounded(tok, vocab, classes, schema_grammar):
    m = PhasedMatcher(schema_grammar.matcher(), plan(tok, "thinking"), classes)
    feed(m, ids(tok, "hm") + [one(tok, "</think>")], vocab.size)
    space = one(tok, " ")
    for _ in range(LEAD_SPACES):
        feed(m, [space], vocab.size)
    assert space not in allowed(m, vocab.size) and not m.accept_token(space)
    feed(m, ids(tok, ANSWER), vocab.size)


def test_openings(tok, vocab, classes, schema_grammar):
    inside = PhasedMatcher(schema_grammar.matcher(), plan(tok, "thinking"), classes)
    assert one(tok, "}") in allowed(inside, vocab.size)  # the prompt opened the thought
    closed = PhasedMatcher(schema_grammar.matcher(), plan(tok, "off"), classes)
    first = allowed(closed, vocab.size)
    assert one(tok, "<think>") not in first and one(tok, "}") not in first
    assert not closed.reasoning_tokens
    none = PhasedMatcher(schema_grammar.matcher(), plan(tok, "maybe", budget=0), classes)
    assert one(tok, "<think>") not in allowed(none, vocab.size)  # budget 0: no thought


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_a_hard_budget_forces_the_end_at_exactly_n_thought_tokens(
    tok, vocab, classes, schema_grammar, budget
):
    m = PhasedMatcher(schema_grammar.matcher(), plan(tok, "thinking", budget=budget), classes)
    end = one(tok, "</think>")
    feed(m, ids(tok, THOUGHT)[:budget], vocab.size)
    assert allowed(m, vocab.size) == {end}
    feed(m, [end] + ids(tok, ANSWER), vocab.size)
    assert m.reasoning_tokens == budget + 1


def test_a_soft_budget_offers_the_end_from_its_start(tok, vocab, classes, schema_grammar):
    m = PhasedMatcher(
        schema_grammar.matcher(), plan(tok, "thinking", budget=10, soft_from=8), classes
    )
    thought = ids(tok, THOUGHT)
    for t in thought[:8]:
        assert m.close_candidate() is None
        feed(m, [t], vocab.size)
    assert m.close_candidate() == one(tok, "</think>")
    assert len(allowed(m, vocab.size)) > 1  # offered, not forced: the sampler decides
    feed(m, thought[8:10], vocab.size)
    assert allowed(m, vocab.size) == {one(tok, "</think>")}  # forced at the budget


def test_a_multi_token_end_marker(default_model_path, vocab, classes, schema_grammar):
    # Without the tags as tokens, "</think>" is several tokens: matched one by one, and a
    # partial marker the model does not finish is thought.
    plain = transformers.AutoTokenizer.from_pretrained(default_model_path)
    end = tuple(ids(plain, "</think>"))
    assert len(end) > 1
    phases = Phases("thinking", tuple(ids(plain, "<think>")), end, excluded=frozenset({0}))
    m = PhasedMatcher(schema_grammar.matcher(), phases, classes)
    feed(m, ids(plain, "a </") + ids(plain, " b"), vocab.size)
    assert not m.in_answer
    feed(m, list(end), vocab.size)
    assert m.in_answer
    feed(m, ids(plain, ANSWER), vocab.size)
    assert allowed(m, vocab.size) == {plain.eos_token_id}


def test_the_end_marker_is_written_only_as_its_own_tokens(
    tok, default_model_path, vocab, classes, schema_grammar
):
    # The splitter ends a thought where the marker's text appears: spelled in other tokens
    # it would end the thought there while the phases went on. So the phases refuse them.
    guard = MarkerGuard.of(b"</think>", vocab.token_bytes)
    m = PhasedMatcher(schema_grammar.matcher(), plan(tok, "thinking", guard=guard), classes)
    plain = transformers.AutoTokenizer.from_pretrained(default_model_path)
    pieces = ids(plain, "a </think")  # no added tokens: "</think" in pieces
    feed(m, pieces, vocab.size)
    closing = one(plain, ">")
    assert closing not in allowed(m, vocab.size) and not m.accept_token(closing)
    assert one(tok, "</think>") in allowed(m, vocab.size)  # the marker's own token is
    feed(m, [one(plain, " ok"), one(tok, "</think>")], vocab.size)
    assert m.in_answer


def test_a_format_header_is_forced_before_the_answer(tok, vocab, classes, schema_grammar):
    header = tuple(ids(tok, " final:"))
    direct = tuple(ids(tok, " direct:"))
    phases = plan(tok, "maybe", answer_ids=header, direct_ids=direct)
    m = PhasedMatcher(schema_grammar.matcher(), phases, classes)
    assert one(tok, "{") not in allowed(m, vocab.size)  # an answer needs its header
    feed(m, ids(tok, "<think> hmm</think>"), vocab.size)
    for t in header:
        assert allowed(m, vocab.size) == {t}
        feed(m, [t], vocab.size)
    assert one(tok, " ") not in allowed(m, vocab.size)  # the answer follows its header at once
    feed(m, ids(tok, ANSWER), vocab.size)
    direct_m = PhasedMatcher(schema_grammar.matcher(), phases, classes)
    feed(direct_m, list(direct) + ids(tok, ANSWER), vocab.size)
    assert direct_m.reasoning_tokens == len(direct)


def test_rollback_crosses_the_switch(tok, vocab, classes, schema_grammar):
    tokens = ids(tok, "<think>" + THOUGHT + "</think>\n\n" + ANSWER)
    m = PhasedMatcher(schema_grammar.matcher(), plan(tok, "maybe", budget=40), classes)
    masks = feed(m, tokens, vocab.size)
    end = tokens.index(one(tok, "</think>"))
    for back in (1, len(tokens) - end, len(tokens) - end + 2, len(tokens)):
        m.rollback(back)
        assert allowed(m, vocab.size) == masks[len(tokens) - back]
        feed(m, tokens[len(tokens) - back :], vocab.size)
    with pytest.raises(ValueError, match="roll back"):
        m.rollback(len(tokens) + 1)


def test_a_call_marker_closes_a_thought(tok, vocab, classes):
    tool = grammars.ToolSchema.of("get_weather", {"type": "object"}, "tools[0]")
    calls = grammars.compile(grammars.ToolCalls((tool,)), vocab)
    phases = plan(tok, "thinking", closer_ids=frozenset({one(tok, "<tool_call>")}))
    m = PhasedMatcher(calls.matcher(), phases, classes)
    feed(m, ids(tok, "I will call it.") + [one(tok, "<tool_call>")], vocab.size)
    assert m.in_answer
    feed(m, ids(tok, '\n{"name": "get_weather", "arguments": {}}\n</tool_call>'), vocab.size)
    assert tok.eos_token_id in allowed(m, vocab.size)


def test_a_free_answer(tok, vocab, classes):
    free = FreeMatcher(classes, frozenset({tok.eos_token_id}))
    m = PhasedMatcher(free, plan(tok, "thinking", budget=2), classes)
    feed(m, ids(tok, " hm ok")[:2] + [one(tok, "</think>")] + ids(tok, "Yes."), vocab.size)
    assert tok.eos_token_id in allowed(m, vocab.size)
    feed(m, [tok.eos_token_id], vocab.size)
    assert m.is_terminated()
