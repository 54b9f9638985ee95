"""Constrained generation through the engine: outputs obey their constraint (checked with
re / jsonschema), bad constraints fail at submit, jump-forward feeds forced text."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest
from conftest import assert_no_kv_leak, compile_taken, wait_for, wait_idle
from shared_cases import PERSON, PHONE

from braid.runtime import SamplingParams


def _params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=120, temperature=1.0, **kw)


def test_regex_json_and_choices_hold_when_sampling(tiny_engine):
    seeds = range(6)
    outs = tiny_engine.generate(["Call me at"] * len(seeds), _params(regex=PHONE, seed=0))
    for out in outs:
        assert re.fullmatch(PHONE, out.text), out.text
        assert out.finish_reason == "stop"
    for seed in seeds:
        out = tiny_engine.generate("Person:", _params(json_schema=PERSON, seed=seed))
        jsonschema.validate(json.loads(out.text), PERSON)
        out = tiny_engine.generate("Pick:", _params(choices=["red", "green", "rebel"], seed=seed))
        assert out.text in ("red", "green", "rebel")
    assert_no_kv_leak(tiny_engine)


def test_greedy_constrained_output_is_valid(tiny_engine):
    out = tiny_engine.generate(
        "x", SamplingParams(max_tokens=200, temperature=0, json_schema=json.dumps(PERSON))
    )
    jsonschema.validate(json.loads(out.text), PERSON)


def test_mixed_batch_from_many_threads(tiny_engine):
    """Constrained and free requests share batches; each keeps its own constraint."""
    results: dict[int, str] = {}

    def run(i: int) -> None:
        kinds = [dict(regex=PHONE), dict(json_schema=PERSON), dict(choices=["yes", "no"]), {}]
        out = tiny_engine.generate(f"request {i}:", _params(seed=i, **kinds[i % 4]))
        results[i] = out.text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, text in results.items():
        if i % 4 == 0:
            assert re.fullmatch(PHONE, text)
        elif i % 4 == 1:
            jsonschema.validate(json.loads(text), PERSON)
        elif i % 4 == 2:
            assert text in ("yes", "no")
    assert len(results) == 12
    wait_idle(tiny_engine)
    assert_no_kv_leak(tiny_engine)


def test_jump_forward_feeds_forced_text_as_canonical_tokens(tiny_engine):
    before = tiny_engine.stats()["jump_forward_tokens"]
    out = tiny_engine.generate(
        "x", _params(regex=r'\{"answer": "(yes|no)", "sure": (true|false)\}')
    )
    assert re.fullmatch(r'\{"answer": "(yes|no)", "sure": (true|false)\}', out.text)
    assert tiny_engine.stats()["jump_forward_tokens"] > before
    # The forced text was retokenized at its boundaries: the tokens are the tokenizer's own.
    assert tiny_engine.tokenizer.decode(out.token_ids) == out.text


def test_fully_forced_output_needs_no_sampling(tiny_engine):
    out = tiny_engine.generate("x", _params(regex=r"The answer is 42\."))
    assert out.text == "The answer is 42."
    assert out.token_ids == tiny_engine.tokenizer.encode(out.text, add_special_tokens=False)


def test_forced_output_in_the_cache_is_not_counted_as_prompt(tiny_engine):
    """Text a grammar forces at admission is output: when the cache already holds it (the
    same request again), cached_tokens still counts only prompt tokens."""
    prompt = "A prompt of a few tokens, forced to answer:"
    params = _params(regex=r"Forced opening text, then [0-9]")
    tiny_engine.generate(prompt, params)
    again = tiny_engine.generate(prompt, params)
    assert again.meta["cached_tokens"] == again.meta["prompt_tokens"]


def test_jump_forward_off_gives_valid_output_too(tiny_model_path):
    from braid.runtime import Engine

    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=2048,
        jump_forward=False,
    )
    try:
        out = engine.generate("x", _params(json_schema=PERSON, seed=3))
        jsonschema.validate(json.loads(out.text), PERSON)
        assert engine.stats()["jump_forward_tokens"] == 0
    finally:
        engine.shutdown()


QUERY = r"""
start: "SELECT " column ("," column)* " FROM " TABLE [" WHERE " column "=" VALUE] ";"
column: "id" | "name" | "age"
TABLE: /[a-z]{1,6}/
VALUE: /[0-9]{1,3}/
"""


def test_ebnf_outputs_parse_with_lark(tiny_engine):
    import lark

    parser = lark.Lark(QUERY, parser="lalr")
    before = tiny_engine.stats()["jump_forward_tokens"]
    for seed in range(4):
        params = SamplingParams(grammar=QUERY, seed=seed, max_tokens=60, temperature=1.0)
        out = tiny_engine.generate("query:", params)
        assert out.finish_reason == "stop", out.text
        parser.parse(out.text)
    assert tiny_engine.stats()["jump_forward_tokens"] > before  # "SELECT " is forced
    assert_no_kv_leak(tiny_engine)


def test_max_tokens_cuts_constrained_output(tiny_engine):
    out = tiny_engine.generate("x", SamplingParams(max_tokens=3, regex=r"[a-z]{50}"))
    assert out.finish_reason == "length" and len(out.token_ids) == 3


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("regex", "(unclosed", "regex"),
        ("json_schema", {"type": "array", "uniqueItems": True}, "uniqueItems"),
        ("json_schema", "{not json", "JSON"),
        ("grammar", "start: undefined_rule", "undefined"),
    ],
)
def test_bad_constraints_fail_at_submit(tiny_engine, field, value, match):
    with pytest.raises(ValueError, match=match):
        tiny_engine.generate("x", SamplingParams(max_tokens=4, **{field: value}))
    assert tiny_engine.generate("x", SamplingParams(max_tokens=2)).finish_reason == "length"
    assert_no_kv_leak(tiny_engine)


def test_constrained_stream_and_abort(tiny_engine):
    import asyncio

    async def first_chunk_then_leave() -> None:
        async for _ in tiny_engine.stream("x", _params(regex=r"[a-z]{80}")):
            break

    asyncio.run(first_chunk_then_leave())
    wait_idle(tiny_engine)
    assert_no_kv_leak(tiny_engine)


@pytest.mark.model
def test_default_model_extracts_valid_json():
    from braid.runtime import Engine

    engine = Engine(max_kv_tokens=4096)
    try:
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Alice is 31 and works as an admin. Give her record."}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out = engine.generate(
            prompt, SamplingParams(max_tokens=80, temperature=0, json_schema=PERSON)
        )
        record = json.loads(out.text)
        jsonschema.validate(record, PERSON)
        assert engine.stats()["jump_forward_tokens"] > 0
    finally:
        engine.shutdown()


def test_forced_text_cut_by_max_tokens_finishes_for_its_length(tiny_engine):
    # The grammar forces the rest after the first choice; max_tokens cuts it short, so the
    # output is not the complete sentence the matcher has taken.
    regex = "(yes|no), the answer is final and long"
    out = tiny_engine.generate("x", SamplingParams(regex=regex, max_tokens=3))
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert re.fullmatch(regex, out.text) is None and out.text.startswith(("yes", "no"))


def test_cancelling_a_prepare_stops_its_compile(tiny_engine):
    """A caller that leaves (the server cancels the future when its client disconnects)
    gives up the compile: the worker compiling it is stopped, its place freed."""
    slow = SamplingParams(stop_regex=["b{20000}"])  # tens of seconds in a compile worker
    taken = compile_taken(tiny_engine.grammars)
    future = tiny_engine.prepare(slow)
    wait_for(taken, 60, "a compile worker to take the stop regex")
    working = set(tiny_engine.grammars.worker_pids())
    assert future.cancel()
    wait_for(lambda: not working <= set(tiny_engine.grammars.worker_pids()), 30, "the stop")
    assert tiny_engine.generate("x", _params(regex="[0-9]")).text.isdigit()
