"""Documents that close: a constrained output that max_tokens would cut is steered to
complete in time (checked with jsonschema), ends "length" when steered, and without
close_documents comes back cut as before."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import assert_no_kv_leak
from shared_cases import PERSON

from braid.runtime import Engine, SamplingParams

SEEDS = range(8)
# The shortest PERSON document, {"name":"","age":0,"role":"user"}, is 33 bytes (12 tokens);
# these leave room for it and cut what the tiny model writes unsteered.
BUDGETS = (34, 40, 48)


def _outputs(engine, budget: int, close: bool, schema=PERSON):
    params = [
        SamplingParams(
            max_tokens=budget, temperature=1.0, seed=s, json_schema=schema, close_documents=close
        )
        for s in SEEDS
    ]
    return [engine.generate("Person:", p) for p in params]


def _parses(text: str, schema) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.mark.parametrize("budget", BUDGETS)
def test_steered_documents_parse_and_validate(tiny_engine, budget):
    for out in _outputs(tiny_engine, budget, close=True):
        jsonschema.validate(json.loads(out.text), PERSON)
        assert len(out.token_ids) <= budget
        assert out.finish_reason in ("stop", "length")
    assert_no_kv_leak(tiny_engine)


def test_a_steered_document_ends_for_its_length(tiny_engine):
    outs = _outputs(tiny_engine, BUDGETS[0], close=True)
    free = _outputs(tiny_engine, 10_000, close=True)
    # Where the unsteered run would be longer than the budget, steering changed the output.
    for out, whole in zip(outs, free, strict=True):
        if len(whole.token_ids) > BUDGETS[0]:
            assert out.finish_reason == "length", out.text
            assert _parses(out.text, PERSON)
        else:
            assert out.text == whole.text and out.finish_reason == whole.finish_reason
    assert any(len(w.token_ids) > BUDGETS[0] for w in free), "no seed was cut: test is vacuous"


def test_without_close_documents_the_cut_document_comes_back(tiny_engine):
    outs = _outputs(tiny_engine, BUDGETS[0], close=False)
    cut = [o for o in outs if not _parses(o.text, PERSON)]
    assert cut, "every unsteered output parsed: the budget does not cut any"
    assert all(o.finish_reason == "length" for o in cut)


def test_a_budget_below_any_document_is_cut_not_crashed(tiny_engine):
    for out in _outputs(tiny_engine, 8, close=True):
        assert len(out.token_ids) == 8
        assert out.finish_reason == "length"
        assert not _parses(out.text, PERSON)
    assert_no_kv_leak(tiny_engine)


SPEC = {
    "ngram": dict(spec_method="ngram", spec_draft_length=4),
    "self-draft": dict(spec_method="draft", draft_model="self:1", spec_draft_length=4),
}


@pytest.mark.parametrize(
    ("method", "temperature"), [("ngram", 0.0), ("ngram", 1.0), ("self-draft", 1.0)]
)
def test_speculative_decoding_steers_as_decoding_does(
    tiny_engine, tiny_model_path, method, temperature
):
    """Draft tokens are checked against the steered masks (a draft model's own masks count
    the tokens drafted before): documents close as without speculation, and n-gram
    speculation writes the same ones token for token."""
    spec = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        **SPEC[method],
    )
    try:
        for seed in SEEDS:
            params = SamplingParams(
                max_tokens=BUDGETS[0], temperature=temperature, seed=seed, json_schema=PERSON
            )
            want = tiny_engine.generate("Person:", params)
            got = spec.generate("Person:", params)
            if method == "ngram":  # point-mass drafts: decoding's own draws
                assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
            assert len(got.token_ids) <= BUDGETS[0]
            jsonschema.validate(json.loads(got.text), PERSON)
        assert spec.stats()["spec_proposed_tokens"] > 0
    finally:
        spec.shutdown()
