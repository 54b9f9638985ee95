"""SamplingParams(trace=True): the engine's own per-token record (forced by the grammar or
sampled, the mask's allowed count) and stage times, checked against what the constraint
implies and the engine's counters; a request without it reports none."""

from __future__ import annotations

import re

from braid.runtime import SamplingParams

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_forced_tokens_match_the_grammar_and_counters(engine):
    before = engine.stats()["jump_forward_tokens"]
    # Compact: the default whitespace lets the model open the document as it likes.
    params = SamplingParams(
        temperature=0, max_tokens=12, json_schema=SCHEMA, json_compact=True, trace=True
    )
    out = engine.generate("JSON:", params)
    trace = out.meta["trace"]
    assert len(trace["forced"]) == len(trace["allowed"]) == len(out.token_ids)
    assert sum(trace["forced"]) == engine.stats()["jump_forward_tokens"] - before > 0
    # The schema forces its required key first: those tokens spell `{"a":` (no token writes
    # `":` and a digit together, so the forced text's last token is forced too), unsampled,
    # and carry no mask count; each sampled token carries one.
    n = trace["forced"].index(False)
    assert engine.tokenizer.decode(out.token_ids[:n]) == '{"a":'
    for forced, allowed in zip(trace["forced"], trace["allowed"], strict=True):
        assert (allowed is None) == forced
    assert trace["arrival"] <= trace["started"] <= trace["first_token"] <= trace["finished"]


def test_allowed_count_is_the_constraints(engine):
    vocab = [engine.tokenizer.decode([t]) for t in range(len(engine.tokenizer))]
    params = SamplingParams(temperature=0, max_tokens=4, regex=r"[0-9]{2,4}", trace=True)
    out = engine.generate("Number:", params)
    # The first token of [0-9]{2,4} may be any token of 1 to 4 digits, and nothing else.
    assert out.meta["trace"]["allowed"][0] == sum(
        bool(re.fullmatch(r"[0-9]{1,4}", t)) for t in vocab
    )
    plain = engine.generate("Number:", SamplingParams(temperature=0, max_tokens=3, trace=True))
    assert plain.meta["trace"]["allowed"] == [None] * len(plain.token_ids)
    assert plain.meta["trace"]["forced"] == [False] * len(plain.token_ids)


def test_untraced_request_reports_no_trace(engine):
    out = engine.generate("Number:", SamplingParams(temperature=0, max_tokens=3, regex="[0-9]+"))
    assert "trace" not in out.meta
