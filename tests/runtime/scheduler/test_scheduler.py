"""Continuous batching on the tiny model: pressure, sharing, preemption, priorities, aborts.

The reference for every output is the same request run alone with no cache.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import transformers
from conftest import assert_no_kv_leak, hold_engine, wait_idle

from braid.runtime import Engine, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def solo(tiny_model_path):
    """Runs each request alone, no prefix cache, a pool big enough for anything."""
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        prefix_cache=False,
    )
    yield engine
    engine.shutdown()


def shared_prefix_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """n prompts in 4 families, each family sharing a long few-shot-like prefix."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, 40000) for _ in range(rng.randrange(40, 90))] for _ in range(4)]
    return [
        prefixes[i % 4] + [rng.randrange(100, 40000) for _ in range(rng.randrange(3, 25))]
        for i in range(n)
    ]


def expected_outputs(solo, prompts, params=GREEDY):
    return [solo.generate(p, params).token_ids for p in prompts]


@pytest.mark.parametrize("mode", ["hybrid", "chunked"])
def test_pressure_outputs_equal_solo_runs(tiny_model_path, solo, mode):
    prompts = shared_prefix_prompts(32)
    expected = expected_outputs(solo, prompts)
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        prefill_mode=mode,
        max_kv_tokens=400,
        chunk_size=16,
        max_batch_tokens=64,
        max_running_requests=16,
    )
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    stats = engine.stats()
    assert stats["preemptions"] > 0, stats  # the pool is too small for all of them
    assert stats["evicted_tokens"] > 0, stats
    assert_no_kv_leak(engine)
    engine.shutdown()


def test_many_threads_equal_solo_runs(tiny_model_path, solo):
    prompts = shared_prefix_prompts(32, seed=1)
    expected = expected_outputs(solo, prompts)
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=900,
        chunk_size=32,
        max_batch_tokens=128,
    )
    with ThreadPoolExecutor(32) as pool:
        outs = list(pool.map(lambda p: engine.generate(p, GREEDY).token_ids, prompts))
    assert outs == expected
    assert_no_kv_leak(engine)
    engine.shutdown()


@pytest.mark.parametrize("chunk_size", [32, 512])  # prefix prefilled in chunks / in one go
@pytest.mark.parametrize("arrive_together", [True, False])
def test_shared_prefix_is_prefilled_once(tiny_model_path, arrive_together, chunk_size):
    rng = random.Random(2)
    prefix = [rng.randrange(100, 40000) for _ in range(120)]
    suffixes = [[rng.randrange(100, 40000) for _ in range(10)] for _ in range(8)]
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        chunk_size=chunk_size,
    )
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompts = [prefix + s for s in suffixes]
    if arrive_together:
        engine.generate(prompts, params)
    else:
        for p in prompts:
            engine.generate(p, params)
    stats = engine.stats()
    ideal = len(prefix) + sum(len(s) for s in suffixes)
    assert ideal <= stats["prefill_tokens_computed"] <= ideal + len(suffixes), stats
    assert stats["cached_tokens"] >= (len(suffixes) - 1) * len(prefix)
    engine.shutdown()


def test_cache_off_computes_everything(tiny_model_path):
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        prefix_cache=False,
    )
    prompts = shared_prefix_prompts(6, seed=3)
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    stats = engine.stats()
    assert stats["prefill_tokens_computed"] == sum(len(p) for p in prompts)
    assert stats["cached_tokens"] == 0 and stats["kv_slots_free"] == stats["kv_slots_total"]
    engine.shutdown()


def test_multi_turn_reuses_generated_tokens(tiny_engine):
    first = tiny_engine.encode("A conversation about ships")
    out = tiny_engine.generate(first, GREEDY)
    before = tiny_engine.stats()["prefill_tokens_computed"]
    second = first + out.token_ids + tiny_engine.encode(" and then")
    tiny_engine.generate(second, SamplingParams(temperature=0, max_tokens=1))
    computed = tiny_engine.stats()["prefill_tokens_computed"] - before
    # Everything but the last generated token (never fed) and the new turn is cached.
    assert computed == len(second) - len(first) - len(out.token_ids) + 1


def test_high_priority_preempts_low(tiny_model_path, solo):
    prompts = shared_prefix_prompts(6, seed=4)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = expected_outputs(solo, prompts, params)
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=260,
        prefix_cache=False,
    )
    # The engine is single-threaded: what it does is fixed once the requests reach it at fixed
    # points of its schedule. The low-priority requests arrive together; the high-priority
    # ones while the engine is held in low 0's emit of its second token.
    tokens: dict[int, list[int]] = {i: [] for i in range(6)}
    finished: list[int] = []  # appended on the engine thread, in the order it finishes them
    lows_decoding, highs_queued, done = threading.Event(), threading.Event(), threading.Event()

    def emit_for(i: int):
        def emit(chunk):
            tokens[i].extend(chunk.token_ids)
            if i == 0 and len(tokens[0]) >= 2 and not lows_decoding.is_set():
                lows_decoding.set()
                highs_queued.wait(60)
            if chunk.finish_reason is not None:
                finished.append(i)
                if len(finished) == 6:
                    done.set()

        return emit

    release = hold_engine(engine)
    for i in range(3):
        engine.submit(prompts[i], params, emit_for(i), priority=0)
    release.set()
    assert lows_decoding.wait(60)
    for i in range(3, 6):
        engine.submit(prompts[i], params, emit_for(i), priority=10)
    highs_queued.set()
    assert done.wait(120), finished
    assert [tokens[i] for i in range(6)] == expected
    assert engine.stats()["preemptions"] > 0
    # The important ones finish first (not all three: together they overflow the pool, so
    # the last to arrive is preempted by its peers, and the lows keep the tokens they made).
    assert set(finished[:2]) <= {3, 4, 5}, finished
    engine.shutdown()


def test_abort_frees_everything(tiny_model_path):
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=2048)
    finals: dict[int, str] = {}
    done, decoding, aborted = threading.Event(), threading.Event(), threading.Event()

    def emit_for(i):
        def emit(chunk):
            # Once 20 tokens are decoded, the engine waits here until the aborts are queued.
            if not decoding.is_set() and engine.stats()["decode_tokens"] >= 20:
                decoding.set()
                aborted.wait(60)
            if chunk.finish_reason:
                finals[i] = chunk.finish_reason
                if len(finals) == 12:
                    done.set()

        return emit

    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    rids = [engine.submit(p, params, emit_for(i)) for i, p in enumerate(shared_prefix_prompts(12))]
    assert decoding.wait(60), "20 tokens were not decoded"
    for rid in rids[::2]:
        engine.abort(rid)
    aborted.set()
    assert done.wait(120)
    assert [finals[i] for i in range(0, 12, 2)] == ["abort"] * 6
    assert [finals[i] for i in range(1, 12, 2)] == ["length"] * 6
    wait_idle(engine)
    assert_no_kv_leak(engine)
    engine.flush_cache()
    assert engine.stats()["kv_slots_free"] == engine.stats()["kv_slots_total"]
    engine.shutdown()


def test_request_too_big_for_the_pool_ends_with_length(tiny_model_path):
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=40)
    out = engine.generate([7] * 30, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert out.finish_reason == "length" and 1 <= len(out.token_ids) <= 11
    with pytest.raises(ValueError, match="the KV pool holds 40"):
        engine.generate([7] * 45)
    assert_no_kv_leak(engine)
    engine.shutdown()


# ---- sampling features, checked against transformers' logits ----------------------------


@pytest.fixture(scope="module")
def hf(tiny_model_path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32
    ).eval()


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


def test_output_and_top_logprobs(tiny_engine, hf):
    ids = tiny_engine.encode("Logprobs please")
    out = tiny_engine.generate(
        ids,
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=True, top_logprobs=3),
    )
    ref = hf_logprobs(hf, ids + out.token_ids)
    for step, tok in enumerate(out.token_ids):
        row = ref[len(ids) + step - 1]
        assert out.meta["logprobs"][step] == pytest.approx(float(row[tok]), abs=1e-4)
        top = row.topk(3)
        got = out.meta["top_logprobs"][step]
        assert list(got) == top.indices.tolist()
        assert list(got.values()) == pytest.approx(top.values.tolist(), abs=1e-4)


@pytest.mark.parametrize("cached_first", [False, True])
def test_prompt_logprobs(tiny_engine, hf, cached_first):
    ids = tiny_engine.encode("Score every token of this prompt, please, from the fourth")
    if cached_first:  # the prompt is in the radix cache: logprobs must still be computed
        tiny_engine.generate(ids, SamplingParams(temperature=0, max_tokens=1))
    out = tiny_engine.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs_from=3))
    ref = hf_logprobs(hf, ids)
    expected = [float(ref[p - 1, ids[p]]) for p in range(3, len(ids))]
    assert out.meta["prompt_logprobs"] == pytest.approx(expected, abs=1e-4)
    assert out.token_ids == [] and out.finish_reason == "length"


def test_prompt_logprobs_across_prefill_chunks(tiny_model_path, hf):
    engine = Engine(
        model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=512, chunk_size=4
    )
    ids = engine.encode("Score every token of this prompt, please, from the fourth")
    out = engine.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs_from=6))
    ref = hf_logprobs(hf, ids)
    expected = [float(ref[p - 1, ids[p]]) for p in range(6, len(ids))]
    assert out.meta["prompt_logprobs"] == pytest.approx(expected, abs=1e-4)
    engine.shutdown()


def test_bfloat16_logits_are_scored_in_float32(tiny_model_path):
    """The model hands back logits in its dtype; logprobs are taken in float32 from them (in
    bfloat16 they would be off by ~1e-2), and penalties and sampling convert them too."""
    from braid.runtime.executor.forward_batch import ForwardBatch

    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="bfloat16", max_kv_tokens=512)
    try:
        ids = engine.encode("Score every token of this prompt, please, from the fourth")
        params = SamplingParams(
            temperature=0, max_tokens=1, logprobs=True, prompt_logprobs_from=3, ignore_eos=True
        )
        out = engine.generate(ids, params)
        slots = engine.kv.allocate(len(ids))
        try:  # the same prefill, run by hand: the same bfloat16 logits
            batch = ForwardBatch.build([ids], [slots], logits_rows=[list(range(len(ids)))])
            logits = engine.model(batch, engine.kv)
        finally:
            engine.kv.free(slots)
        assert logits.dtype == torch.bfloat16
        ref = torch.log_softmax(logits.float(), -1)
        expected = [float(ref[p - 1, ids[p]]) for p in range(3, len(ids))]
        assert out.meta["prompt_logprobs"] == pytest.approx(expected, abs=1e-5)
        assert out.token_ids == [int(ref[-1].argmax())]
        assert out.meta["logprobs"][0] == pytest.approx(float(ref[-1].max()), abs=1e-5)
        sampled = SamplingParams(
            temperature=0.8, seed=5, max_tokens=6, repetition_penalty=1.3, ignore_eos=True
        )
        assert engine.generate(ids, sampled).token_ids == engine.generate(ids, sampled).token_ids
    finally:
        engine.shutdown()


def test_n_samples_share_the_prompt(tiny_engine):
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, n=4, seed=11)
    outs = tiny_engine.generate("Pick a word:", params)
    assert len(outs) == 4 and len({tuple(o.token_ids) for o in outs}) > 1
    again = tiny_engine.generate("Pick a word:", params)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]


def test_penalties_match_a_reference_loop(tiny_engine, hf):
    params = SamplingParams(
        temperature=0,
        max_tokens=16,
        ignore_eos=True,
        repetition_penalty=1.8,
        frequency_penalty=0.7,
        presence_penalty=0.4,
    )
    ids = tiny_engine.encode("Repeat repeat repeat")
    out = tiny_engine.generate(ids, params)
    seq, generated = list(ids), []
    for _ in range(16):
        with torch.no_grad():
            logits = hf(torch.tensor([seq])).logits[0, -1].float()
        seen = torch.tensor(sorted(set(seq)))
        v = logits[seen]
        logits[seen] = torch.where(v > 0, v / 1.8, v * 1.8)
        if generated:
            counts = torch.bincount(torch.tensor(generated), minlength=logits.numel()).float()
            logits -= 0.7 * counts + 0.4 * (counts > 0).float()
        tok = int(logits.argmax())
        seq.append(tok)
        generated.append(tok)
    assert out.token_ids == generated


def test_min_tokens_suppresses_eos(tiny_engine):
    free = tiny_engine.generate(
        "Min tokens", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )
    eos = free.token_ids[1]
    out = tiny_engine.generate(
        "Min tokens",
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[eos], min_tokens=5),
    )
    assert len(out.token_ids) >= 5
    assert eos not in out.token_ids[:5]


# ---- branches of a shared prefix, all at once ------------------------------------------------


def test_branches_prefill_their_prefix_once_and_match_solo(tiny_model_path, solo):
    rng = random.Random(5)
    prefix = [rng.randrange(100, 40000) for _ in range(120)]
    branches = [[rng.randrange(100, 40000) for _ in range(10)] for _ in range(4)]
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=2048)
    outs = engine.generate([prefix + b for b in branches], GREEDY)
    assert [o.token_ids for o in outs] == expected_outputs(solo, [prefix + b for b in branches])
    computed = engine.stats()["prefill_tokens_computed"]
    assert len(prefix) + 40 <= computed <= len(prefix) + 40 + 4
    engine.shutdown()


def test_branches_score_choices_with_prompt_logprobs(tiny_engine, hf):
    """What select does: one request per choice, prompt logprobs of the choice tokens only."""
    prefix = tiny_engine.encode("The best fruit is")
    choices = [
        tiny_engine.tokenizer.encode(c, add_special_tokens=False)
        for c in (" apple", " banana split", " cherry")
    ]
    score = SamplingParams(max_tokens=0, prompt_logprobs_from=len(prefix))
    outs = tiny_engine.generate([prefix + c for c in choices], score)
    for choice, out in zip(choices, outs, strict=True):
        ref = hf_logprobs(hf, prefix + choice)
        expected = [float(ref[len(prefix) + i - 1, t]) for i, t in enumerate(choice)]
        assert out.meta["prompt_logprobs"] == pytest.approx(expected, abs=1e-4)
