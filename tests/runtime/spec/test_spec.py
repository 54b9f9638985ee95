"""Speculative decoding on the tiny models: greedy output identical to decoding without it
(n-gram, draft model, self-draft; free and constrained; alone, batched, under preemption),
seeded sampling reproduced exactly by n-gram drafts, the rejection rule preserving the target
distribution (chi-square), tree attention, and no KV leaks.

The tiny llama's greedy output repeats one token; a frequency penalty makes it switch now and
then, so drafts are both accepted and rejected (every parity test checks both happened).
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
from conftest import assert_no_kv_leak, wait_idle

from braid.runtime import Engine, SamplingParams
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config
from braid.runtime.spec.adaptive import Acceptance
from braid.runtime.spec.ngram import NgramIndex
from braid.runtime.spec.tree import ROOT, DraftTree
from braid.runtime.spec.verify import race, rejection_sample

PENALISED = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, frequency_penalty=0.5)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 6},
    },
    "required": ["name", "age", "tags"],
}
# Every item after the first starts with forced text ({"id":), which drafts carry for free.
ROWS = {
    "type": "array",
    "minItems": 5,
    "maxItems": 5,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "ok"],
    },
}
# method -> engine fields (the draft model is the tiny model itself: same tokenizer). A fixed
# draft length: the adaptive one depends on measured step times (a draft model as large as
# the target rightly switches itself off), which would make what a test exercises vary.
METHODS = {
    "ngram": dict(spec_method="ngram", spec_draft_length=4),
    "self-draft": dict(spec_method="draft", draft_model="self:1", spec_draft_length=4),
    "draft": dict(spec_method="draft", draft_model=None, spec_draft_length=4),
}


def _engine(path, method: str | None = None, **config) -> Engine:
    fields = dict(device="cpu", dtype="float32", max_kv_tokens=4096)
    if method is not None:
        fields.update(METHODS[method])
        if method == "draft":
            fields["draft_model"] = str(path)
    return Engine(model=str(path), **(fields | config))


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(rng.randrange(5, 30))] for _ in range(n)]


@pytest.fixture(scope="module")
def plain(tiny_model_path):
    engine = _engine(tiny_model_path)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module", params=list(METHODS))
def spec(request, tiny_model_path):
    engine = _engine(tiny_model_path, request.param)
    yield engine
    engine.shutdown()


def _spec_counts(engine) -> tuple[int, int]:
    s = engine.stats()
    return s["spec_proposed_tokens"], s["spec_accepted_tokens"]


def _check_settled(engine) -> None:
    """No KV slot leaked, the draft model's included."""
    wait_idle(engine)
    assert_no_kv_leak(engine)
    s = engine.stats()
    assert s.get("draft_kv_slots_free") == s.get("draft_kv_slots_total"), s


# ---- pieces ---------------------------------------------------------------------------------


def test_draft_tree_trie_and_follow():
    tree = DraftTree.from_paths([[1, 2, 3], [1, 2, 4], [5]])
    assert tree.tokens == [1, 2, 3, 4, 5] and tree.parents == [ROOT, 0, 1, 1, ROOT]
    assert tree.children(ROOT) == {1: 0, 5: 4} and tree.num_leaves() == 3
    assert tree.follow(ROOT, [1, 2, 4, 9]) == [0, 1, 3]
    assert tree.follow(1, [3]) == [2] and tree.follow(ROOT, [7]) == []


def test_ngram_continuations():
    index = NgramIndex()  # one per request: its tokens only grow
    tokens = [7, 1, 2, 3, 9, 1, 2, 4, 8, 1, 2]
    # The most recent occurrence of the longest match first; distinct continuations only.
    assert index.propose(tokens, 3, width=4) == [[4, 8, 1], [3, 9, 1]]
    assert index.propose(tokens, 3, width=1) == [[4, 8, 1]]
    assert index.propose([*tokens, 3], 2, width=4) == [[9, 1]]  # indexed incrementally
    # A suffix that repeats continues with the same period.
    assert NgramIndex().propose([5, 6, 5, 6, 5], 4, width=1) == [[6, 5, 6, 5]]
    assert NgramIndex().propose([1, 2, 3], 3, width=2) == []


def test_ngram_prefers_the_occurrence_that_agrees_furthest_back():
    # "a b c d" recurs twice; the older occurrence is also preceded by "x y", as the end is:
    # that is the one being copied, whatever the more recent one continues with.
    x, y, a, b, c, d = 10, 11, 1, 2, 3, 4
    tokens = [x, y, a, b, c, d, 20, 21, 5, a, b, c, d, 30, 31, 6, x, y, a, b, c, d]
    assert NgramIndex().propose(tokens, 2, width=2) == [[20, 21], [30, 31]]


def test_adaptive_length_follows_acceptance():
    good, bad = Acceptance(), Acceptance()
    for _ in range(20):
        good.record(accepted=8, depth=8)
        bad.record(accepted=0, depth=4)
    assert good.choose_length(token_cost=0.04, limit=16) >= 10
    assert bad.choose_length(token_cost=0.04, limit=16) == 0  # switched off ...
    assert bad.off_steps > 0
    for _ in range(bad.off_steps - 1):
        assert bad.choose_length(token_cost=0.04, limit=16) == 0
    assert bad.choose_length(token_cost=0.04, limit=16) == 0  # ... and reset to the prior
    assert bad.choose_length(token_cost=0.04, limit=16) > 0  # tried afresh


def test_tree_attention_equals_separate_runs(tiny_model_path):
    """Tree nodes see the prefix and their ancestors only: each node's logits equal those of
    its path fed as an ordinary causal extend."""
    config = load_model_config(tiny_model_path)
    model = load_model(tiny_model_path, config, torch.float32, torch.device("cpu"))
    kv = KVPool(config.num_layers, 256, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    prefix = list(range(500, 510))
    slots = kv.allocate(10)
    model(ForwardBatch.build([prefix], [slots]), kv)
    # last token 42, then a tree: 42 -> {11 -> {12, 13}, 21 -> 22}
    tokens, parents = [42, 11, 12, 13, 21, 22], [-1, 0, 1, 1, 0, 4]
    tree_slots = torch.cat([slots, kv.allocate(len(tokens))])
    fb = ForwardBatch.build([tokens], [tree_slots], [list(range(len(tokens)))], parents=[parents])
    tree_logits = model(fb, kv)
    for node, path in {2: [42, 11, 12], 3: [42, 11, 13], 5: [42, 21, 22]}.items():
        run_slots = torch.cat([slots, kv.allocate(len(path))])
        run = model(ForwardBatch.build([path], [run_slots], [list(range(len(path)))]), kv)
        torch.testing.assert_close(tree_logits[node], run[-1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(tree_logits[parents[node]], run[-2], rtol=1e-4, atol=1e-4)


# ---- greedy parity --------------------------------------------------------------------------


def test_greedy_identical_alone_and_batched(plain, spec):
    prompts = _prompts(10)
    expected = [o.token_ids for o in plain.generate(prompts, PENALISED)]
    proposed0, accepted0 = _spec_counts(spec)
    alone = [spec.generate(p, PENALISED).token_ids for p in prompts[:3]]
    assert alone == expected[:3]
    batched = [o.token_ids for o in spec.generate(prompts, PENALISED)]
    assert batched == expected
    proposed, accepted = _spec_counts(spec)
    assert 0 < accepted - accepted0 < proposed - proposed0  # accepted and rejected drafts
    _check_settled(spec)


@pytest.mark.parametrize("method", ["ngram", "self-draft"])
def test_greedy_identical_under_preemption(tiny_model_path, plain, method):
    """A pool far too small for all requests: preemption and eviction mid-speculation."""
    rng = random.Random(3)
    shared = [rng.randrange(100, 40000) for _ in range(40)]
    prompts = [shared + p for p in _prompts(24, seed=4)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=0.5)
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    engine = _engine(
        tiny_model_path,
        method,
        max_kv_tokens=400,
        chunk_size=16,
        max_batch_tokens=96,
        max_running_requests=16,
    )
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    stats = engine.stats()
    assert stats["preemptions"] > 0, stats
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_proposed_tokens"], stats
    _check_settled(engine)
    engine.shutdown()


@pytest.mark.parametrize(
    "constraint",
    [dict(regex=r"(ab|cd|[0-9]{2}-)+"), dict(json_schema=PERSON), dict(json_schema=ROWS)],
    ids=["regex", "json", "json-rows"],
)
def test_greedy_constrained_identical(plain, spec, constraint):
    params = SamplingParams(temperature=0, max_tokens=60, frequency_penalty=0.3, **constraint)
    prompts = ["Person:", "x", "data: ab", "Record 7"]
    expected = plain.generate(prompts, params)
    proposed0, accepted0 = _spec_counts(spec)
    outs = spec.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    assert [o.text for o in outs] == [o.text for o in expected]
    if "json_schema" in constraint:
        for o in outs:
            if o.finish_reason == "stop":
                json.loads(o.text)
    proposed, accepted = _spec_counts(spec)
    assert accepted > accepted0 and proposed > proposed0
    _check_settled(spec)


def test_stops_and_logprobs_unchanged(plain, spec):
    prompt = _prompts(1, seed=9)[0]
    full = plain.generate(prompt, PENALISED)
    stop_id = full.token_ids[12]
    stop_text = plain.tokenizer.decode(full.token_ids[20:22])
    cases = [
        dict(stop_token_ids=[stop_id]),
        dict(stop=[stop_text]),
        dict(max_tokens=7),
        dict(logprobs=True, top_logprobs=3),
        dict(min_tokens=30, stop_token_ids=[stop_id]),
    ]
    for extra in cases:
        fields = {f: getattr(PENALISED, f) for f in PENALISED.__struct_fields__} | extra
        params = SamplingParams(**fields)
        want, got = plain.generate(prompt, params), spec.generate(prompt, params)
        assert (got.token_ids, got.text, got.finish_reason) == (
            want.token_ids,
            want.text,
            want.finish_reason,
        ), extra
        assert got.meta.keys() == want.meta.keys()
        if "logprobs" in extra:
            assert got.meta["logprobs"] == pytest.approx(want.meta["logprobs"], abs=1e-4)
            for a, b in zip(got.meta["top_logprobs"], want.meta["top_logprobs"], strict=True):
                assert a.keys() == b.keys() and list(a.values()) == pytest.approx(
                    list(b.values()), abs=1e-4
                )
    _check_settled(spec)


def test_adaptive_length_identical_and_speculating(tiny_model_path, plain):
    """Adaptive draft lengths (the engine's measured step cost pinned, so the lengths chosen
    do not depend on this machine's load) keep output identical."""
    engine = _engine(tiny_model_path, spec_method="ngram")
    engine.worker.cost.token_cost = lambda base_tokens, extra_seconds=0.0: 0.04
    prompts = _prompts(8, seed=7)
    expected = [o.token_ids for o in plain.generate(prompts, PENALISED)]
    assert [o.token_ids for o in engine.generate(prompts, PENALISED)] == expected
    stats = engine.stats()
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_proposed_tokens"], stats
    assert stats["spec_ngram_mean_accepted_length"] > 1
    _check_settled(engine)
    engine.shutdown()


# ---- sampling ---------------------------------------------------------------------------------


def test_ngram_reproduces_seeded_sampling(tiny_model_path, plain):
    """With n-gram (point-mass) drafts the acceptance rule is 'draw as decoding draws, keep
    the draft if it matches': the same seeds give the very same tokens."""
    engine = _engine(tiny_model_path, "ngram")
    params = SamplingParams(
        temperature=0.7, top_p=0.95, max_tokens=40, ignore_eos=True, seed=11, n=6
    )
    prompt = _prompts(1, seed=5)[0]
    want = [o.token_ids for o in plain.generate(prompt, params)]
    got = [o.token_ids for o in engine.generate(prompt, params)]
    assert got == want
    assert engine.stats()["spec_accepted_tokens"] > 0
    _check_settled(engine)
    engine.shutdown()


def _chi_square_p_value(observed: list[int], expected: list[float]) -> float:
    """Pearson's goodness of fit: P(chi2 with len - 1 degrees of freedom >= statistic)."""
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def test_rejection_rule_gives_the_target_distribution():
    """The rule alone, with p and q overlapping in part: x ~ q, then accept or resample;
    the tokens must be distributed as p (a wrong residual or acceptance is far off)."""
    p = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05, 0.0])
    q = torch.tensor([0.1, 0.3, 0.0, 0.3, 0.1, 0.2])
    num_draws = 6000
    counts = [0] * len(p)
    for i in range(num_draws):
        x = race(q, seed=1_000_003 * i + 1)
        counts[rejection_sample(p, x, q, accept_seed=2 * i + 1, seed=3 * i + 2)] += 1
    assert counts[-1] == 0  # p(5) = 0: never produced, though q proposes it
    expected = (p[:-1] * num_draws).tolist()
    assert _chi_square_p_value(counts[:-1], expected) > 1e-3, (counts, expected)


def test_rejection_sampling_preserves_target_distribution(tiny_model_path, make_tiny_model):
    """Draft-model drafts decide the second token by the rejection rule; the draft is another
    random tiny model, so q is far from p (against a near copy of p, a rule that accepts too
    often goes unseen). Given each sample's first token, the second must follow the target's
    distribution, computed exactly from its logits: a chi-square test on the second token's
    rank bin under p, the expected count of a bin being the sum of its probability over the
    samples."""
    engine = _engine(
        tiny_model_path,
        spec_method="draft",
        draft_model=str(make_tiny_model("llama3-rope")),
        spec_draft_length=1,
        max_running_requests=512,
    )
    temperature, num_samples = 1.0, 600
    params = SamplingParams(
        temperature=temperature, max_tokens=3, ignore_eos=True, seed=2024, n=num_samples
    )
    prompt = [1000 + 37 * i for i in range(12)]
    proposed0, accepted0 = _spec_counts(engine)
    outs = engine.generate(prompt, params)
    proposed, accepted = _spec_counts(engine)
    assert 0 < accepted - accepted0 < proposed - proposed0  # the rule accepted and rejected
    _check_settled(engine)
    engine.shutdown()

    # p(second | prompt, first) for every first token seen, in one forward of the target.
    firsts = sorted({o.token_ids[0] for o in outs})
    config = load_model_config(tiny_model_path)
    model = load_model(tiny_model_path, config, torch.float32, torch.device("cpu"))
    length = len(prompt) + 1
    kv = KVPool(config.num_layers, length * len(firsts), config.num_kv_heads, config.head_dim,
                torch.float32, "cpu")  # fmt: skip
    fb = ForwardBatch.build([prompt + [a] for a in firsts], [kv.allocate(length) for _ in firsts])
    vocab = len(engine.tokenizer)
    probs = torch.softmax(model(fb, kv)[:, :vocab] / temperature, dim=-1)  # [firsts, V]
    ordered = probs.sort(dim=-1, descending=True).values
    edges = [0, 1, 5, 50, vocab]  # rank bins: the top token, 2-5, 6-50, the rest
    mass = torch.stack([ordered[:, a:b].sum(-1) for a, b in itertools.pairwise(edges)], -1)
    observed, expected = [0] * 4, torch.zeros(4, dtype=torch.float64)
    for o in outs:
        row = firsts.index(o.token_ids[0])
        rank = int((probs[row] > probs[row, o.token_ids[1]]).sum())
        observed[sum(rank >= e for e in edges[1:-1])] += 1
        expected += mass[row]
    p_value = _chi_square_p_value(observed, expected.tolist())
    assert p_value > 1e-3, (p_value, observed, expected)


def test_bad_spec_config():
    with pytest.raises(ValueError, match="spec_method"):
        Engine(spec_method="medusa")
    with pytest.raises(ValueError, match="draft_model"):
        Engine(spec_method="draft")
    with pytest.raises(ValueError, match="spec_tree_width"):
        Engine(spec_method="ngram", spec_tree_width=0)
