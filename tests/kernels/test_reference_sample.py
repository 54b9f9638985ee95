"""braid.kernels.reference.sampling.sample, the CPU sampler and the twin kernels.reference
re-exports: the semantics every sampling kernel must reproduce."""

from __future__ import annotations

import pytest
import torch

from braid.kernels.reference.sampling import apply_bitmask, sample, uniform_noise, unpack_bitmask

NEG_INF = float("-inf")


def params(b: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed0=0):
    return dict(
        temperature=torch.full((b,), temperature),
        top_k=torch.full((b,), top_k, dtype=torch.int64),
        top_p=torch.full((b,), top_p),
        min_p=torch.full((b,), min_p),
        seeds=torch.arange(seed0, seed0 + b, dtype=torch.int64),
    )


def pack(allowed: torch.Tensor) -> torch.Tensor:
    """bool [B, V] -> int32 [B, ceil(V/32)] in the shared bitmask layout."""
    b, v = allowed.shape
    words = (v + 31) // 32
    padded = torch.zeros(b, words * 32, dtype=torch.int64)
    padded[:, :v] = allowed.long()
    packed = (padded.view(b, words, 32) << torch.arange(32)).sum(-1)  # (B, W)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def test_pack_unpack_roundtrip():
    allowed = torch.rand(5, 77, generator=torch.Generator().manual_seed(0)) < 0.5
    assert torch.equal(unpack_bitmask(pack(allowed), 77), allowed)


def test_bitmask_trailing_bits_ignored_and_missing_words_disallow():
    full = torch.full((2, 2), -1, dtype=torch.int32)  # every bit set, 64 tokens' worth
    assert unpack_bitmask(full, 40).all()
    logits = torch.zeros(2, 70)
    masked = apply_bitmask(logits, full)
    assert torch.isfinite(masked[:, :64]).all() and torch.isneginf(masked[:, 64:]).all()
    assert (sample(logits, full, **params(2))[0] < 64).all()


def test_greedy_is_exact_argmax_over_allowed_tokens():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 100, generator=g)
    logits[3, [5, 9]] = 50.0  # a tie: the lower index wins
    logits[4, [70, 12]] = 50.0
    allowed = torch.rand(16, 100, generator=g) < 0.3
    allowed[3:5, [5, 9, 12, 70]] = True
    for mask in (None, pack(allowed)):
        ids, lp = sample(logits, mask, **params(16, temperature=0.0))
        ref_logits = logits if mask is None else logits.masked_fill(~allowed, NEG_INF)
        assert torch.equal(ids, ref_logits.argmax(-1))
        assert ids[3] == 5 and ids[4] == 12
        expected = torch.log_softmax(ref_logits, -1).gather(1, ids[:, None])[:, 0]
        torch.testing.assert_close(lp, expected)


def test_other_dtypes():
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(8, 64, generator=g).bfloat16()
    p = params(8, temperature=0.0)
    p["top_k"] = p["top_k"].int()
    ids, lp = sample(logits, None, **p)
    assert ids.dtype == torch.int64 and lp.dtype == torch.float32
    assert torch.equal(ids, logits.float().argmax(-1))
    ids, _ = sample(logits, None, **params(8, top_k=1))
    assert torch.equal(ids, logits.float().argmax(-1))


def test_never_samples_a_masked_token():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 300, generator=g) * 3
    allowed = torch.rand(64, 300, generator=g) < 0.05
    allowed[:, 7] = True
    mask = pack(allowed)
    for seed0 in range(0, 2000, 64):
        ids, _ = sample(logits, mask, **params(64, temperature=1.5, seed0=seed0))
        assert allowed[torch.arange(64), ids].all()
    ids, _ = sample(logits, mask, **params(64, temperature=1.5, top_p=0.9, min_p=0.01))
    assert allowed[torch.arange(64), ids].all()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_allowing_nothing_gets_minus_one(temperature):
    allowed = torch.ones(3, 40, dtype=torch.bool)
    allowed[1] = False
    logits = torch.randn(3, 40)
    logits[2] = float("-inf")  # all -inf without a mask: nothing to draw either
    ids, lp = sample(logits, pack(allowed), **params(3, temperature=temperature))
    assert ids.tolist()[1:] == [-1, -1] and lp[1:].isneginf().all()
    assert ids[0] >= 0 and lp[0].isfinite()


def test_top_k_one_is_greedy_and_top_k_stays_in_the_top():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(32, 50, generator=g)
    ids, _ = sample(logits, None, **params(32, top_k=1))
    assert torch.equal(ids, logits.argmax(-1))
    top5 = logits.topk(5).indices
    for seed0 in range(0, 640, 32):
        ids, _ = sample(logits, None, **params(32, top_k=5, seed0=seed0))
        assert (top5 == ids[:, None]).any(-1).all()


def test_top_k_keeps_every_token_tied_at_the_boundary():
    logits = torch.tensor([3.0, 1.0, 1.0, 0.9] + [0.0] * 12).expand(4000, 16)
    ids, _ = sample(logits, None, **params(4000, top_k=2))
    assert set(ids.tolist()) == {0, 1, 2}


@pytest.mark.parametrize(
    "probs, filters, support",
    [
        # top-p on the renormalised top-3 (0.57, 0.29, 0.14) stops at two tokens; on the raw
        # distribution (0.4, 0.2, 0.1 of 1.0) it would keep three.
        ([0.4, 0.2, 0.1] + [0.3 / 13] * 13, dict(top_k=3, top_p=0.8), {0, 1}),
        # top-p before min-p keeps token 2 (0.2 >= 0.4 * 0.4); min-p first would renormalise
        # to (0.44, 0.33, 0.22) and let top-p drop it.
        ([0.4, 0.3, 0.2, 0.1], dict(top_p=0.75, min_p=0.4), {0, 1, 2}),
    ],
    ids=["top_k-then-top_p", "top_p-then-min_p"],
)
def test_filters_compose_in_order_top_k_top_p_min_p(probs, filters, support):
    n = 3000
    logits = torch.tensor(probs).log().expand(n, len(probs))
    ids, _ = sample(logits, None, **params(n, **filters))
    assert set(ids.tolist()) == support


@pytest.mark.parametrize(
    "filters", [dict(top_k=4), dict(top_p=0.6), dict(min_p=0.3)], ids=lambda f: next(iter(f))
)
def test_filters_only_return_kept_tokens(filters):
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(32, 50, generator=g) * 2
    kept = torch.stack([reference_distribution(row, 0.8, **filters) > 0 for row in logits])
    assert (kept.sum(-1) < 50).all()  # the filter really drops something in every row
    for seed0 in range(0, 640, 32):
        ids, _ = sample(logits, None, **params(32, temperature=0.8, seed0=seed0, **filters))
        assert kept[torch.arange(32), ids].all()


def test_reproducible_per_seed_whatever_the_batch():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(8, 64, generator=g)
    p = params(8, seed0=100)
    ids, lp = sample(logits, None, **p)
    again, _ = sample(logits, None, **p)
    assert torch.equal(ids, again)
    # Row 5 alone, and row 5 placed first in a reversed batch, draw the same token.
    one = {k: v[5:6] for k, v in p.items()}
    assert sample(logits[5:6], None, **one)[0].item() == ids[5].item()
    rev = {k: v.flip(0) for k, v in p.items()}
    assert torch.equal(sample(logits.flip(0), None, **rev)[0], ids.flip(0))
    flat = torch.zeros(200, 1000)
    draws = sample(flat, None, **params(200))[0]
    assert draws.unique().numel() > 150  # different seeds, different draws


def test_unfiltered_row_is_bit_identical_next_to_filtered_rows():
    # Rows alone take the no-sort path; next to a top-k / top-p row they go through the sort.
    g = torch.Generator().manual_seed(8)
    # Near-flat rows make close races; peaked rows make the float32 cumsum reach 1.0 early,
    # which must not cut anything from a row whose top_p is off.
    scale = torch.tensor([0.1, 5.0]).repeat_interleave(4).repeat(8).unsqueeze(1)  # (64, 1)
    logits = torch.randn(64, 5000, generator=g) * scale
    p = params(64, seed0=7)
    p["top_k"][1::2] = 5
    p["top_p"][2::4] = 0.5
    ids, lp = sample(logits, None, **p)
    plain = slice(0, None, 4)  # rows with no filter
    alone = sample(logits[plain], None, **{k: v[plain] for k, v in p.items()})
    assert torch.equal(ids[plain], alone[0])
    assert torch.equal(lp[plain], alone[1])


def hash_uint32(seed: int, t: int) -> int:
    """The documented hash in plain Python integers, independently of the tensor code."""

    def fmix32(h: int) -> int:
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    seed &= 2**64 - 1
    row = fmix32((seed & 0xFFFFFFFF) ^ fmix32(seed >> 32))
    return fmix32(row ^ ((t * 0x9E3779B9) & 0xFFFFFFFF))


def test_uniform_noise_is_the_documented_hash_bit_for_bit():
    seeds = [0, 1, 2**31, 2**32 + 5, -1, -(2**63), 2**63 - 1, 123456789012345]
    vocab = 300
    u = uniform_noise(torch.tensor(seeds), vocab)
    expected = torch.tensor(
        [[(2 * (hash_uint32(s, t) >> 9) + 1) / 2**24 for t in range(vocab)] for s in seeds],
        dtype=torch.float64,
    )
    assert torch.equal(u.double(), expected)


def test_uniform_noise_is_in_the_open_interval_and_flat():
    u = uniform_noise(torch.arange(50), 4000)
    assert (u > 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.01
    counts = torch.histc(u, bins=10, min=0, max=1)
    assert chi2_pvalue(counts, torch.full((10,), u.numel() / 10)) > 1e-3


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    stat = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = torch.tensor(float(keep.sum() - 1))
    return float(torch.special.gammaincc(df / 2, stat / 2))


def reference_distribution(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The filtered, renormalised distribution of one row, written independently of sample."""
    p = torch.softmax(logits / temperature, -1)
    if top_k:
        p = torch.where(p >= p.topk(top_k).values[-1], p, 0)
        p = p / p.sum()
    if top_p < 1:
        order = p.argsort(descending=True)
        mass_before = p[order].cumsum(0) - p[order]
        keep = torch.zeros_like(p, dtype=torch.bool)
        keep[order] = mass_before < top_p
        p = torch.where(keep, p, 0)
        p = p / p.sum()
    if min_p:
        p = torch.where(p >= min_p * p.max(), p, 0)
        p = p / p.sum()
    return p


FILTERS = [dict(), dict(top_k=5), dict(top_p=0.7), dict(min_p=0.2), dict(top_k=8, top_p=0.9)]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f) or "plain")
def test_sampled_distribution_matches_the_reference(filters):
    n, vocab = 20000, 16
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(5)) * 1.5
    ids, lp = sample(logits.expand(n, vocab), None, **params(n, temperature=0.7, **filters))
    expected = reference_distribution(logits, 0.7, **filters)
    counts = torch.bincount(ids, minlength=vocab).float()
    assert counts[expected == 0].sum() == 0
    assert chi2_pvalue(counts, expected * n) > 1e-3
    torch.testing.assert_close(lp, expected[ids].log())
    if filters:  # negative control: the unfiltered distribution must be rejected
        unfiltered = reference_distribution(logits, 0.7)
        assert chi2_pvalue(counts, unfiltered * n) < 1e-6
