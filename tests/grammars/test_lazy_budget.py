"""The lazy automaton's memory budget: past it the automaton starts over and its matchers
replay their tokens (masks unchanged); an output that alone outgrows it fails with
MatcherError, and through the engine only that request fails."""

from __future__ import annotations

import random
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import assert_no_kv_leak

from braid import grammars
from braid.grammars.matcher import MatcherError, allowed_token_ids
from braid.grammars.regex.lazy import LazyRegexGrammar

# Exponential DFA: a state remembers the last 17 characters, so a random a/b text reaches a
# new state with almost every character.
BLOWUP = r"[ab]*a[ab]{16}"


def _random_token(row: torch.Tensor, eos_ids, rng: random.Random) -> int:
    return rng.choice([t for t in allowed_token_ids(row) if t not in eos_ids])


def test_renewal_keeps_every_matcher_on_course(vocab):
    small = LazyRegexGrammar(BLOWUP, vocab, max_state_mb=1)
    rows = grammars.allocate_bitmask(2, vocab.size)
    matchers = [small.matcher() for _ in range(3)]
    texts = [b""] * 3
    rng = random.Random(0)
    for step in range(600):  # interleaved: renewals land while other matchers are mid-text
        i = step % 3
        matchers[i].fill_bitmask(rows[0])
        token = _random_token(rows[0], vocab.eos_token_ids, rng)
        assert matchers[i].accept_token(token)
        texts[i] += vocab.token_bytes[token]
    assert small.generation >= 1, "600 tokens should outgrow 1 MB of states"
    assert small.stats()["state_bytes"] <= 1 << 20

    roomy = LazyRegexGrammar(BLOWUP, vocab)
    for matcher, text in zip(matchers, texts, strict=True):
        reference = roomy.matcher()
        ids = [vocab.token_bytes.index(bytes([c])) for c in text]  # single-byte tokens
        assert all(reference.accept_token(t) for t in ids)
        matcher.fill_bitmask(rows[0])
        reference.fill_bitmask(rows[1])
        assert torch.equal(rows[0], rows[1])
        eos = min(vocab.eos_token_ids)
        assert matcher.accept_token(eos) == bool(re.fullmatch(BLOWUP, text.decode()))


def test_an_output_that_alone_outgrows_the_budget_fails(vocab):
    grammar = LazyRegexGrammar(BLOWUP, vocab, max_state_mb=1)
    matcher = grammar.matcher()
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    rng = random.Random(1)
    with pytest.raises(MatcherError, match="outgrew its 1 MB budget"):
        for _ in range(20_000):
            matcher.fill_bitmask(row)
            assert matcher.accept_token(_random_token(row, vocab.eos_token_ids, rng))


def test_the_engine_fails_only_the_request_whose_grammar_gives_out(tiny_model_path):
    from braid.runtime import Engine, SamplingParams

    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=8192,
        grammar_state_memory_mb=1,
    )
    # 600 counted characters send the regex to the lazy automaton; min_tokens keeps it going.
    runaway = SamplingParams(
        regex=BLOWUP + "[ab]{0,600}", min_tokens=3000, max_tokens=3000, temperature=1.0, seed=0
    )
    plain = SamplingParams(regex=r"[0-9]{3}", max_tokens=8, temperature=1.0, seed=0)
    try:
        with ThreadPoolExecutor(2) as pool:
            failing = pool.submit(engine.generate, "x", runaway)
            fine = engine.generate("y", plain)  # while the other one decodes
            with pytest.raises(ValueError, match="outgrew its 1 MB budget"):
                failing.result()
        assert fine.finish_reason == "stop" and re.fullmatch(r"[0-9]{3}", fine.text)
        assert engine.generate("z", plain).finish_reason == "stop"  # still serving
        assert_no_kv_leak(engine)
    finally:
        engine.shutdown()
