"""kernels.reference.sample: the semantics every sampling kernel must reproduce."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import sample, uniform_noise, unpack_bitmask


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
    packed = (padded.view(b, words, 32) << torch.arange(32)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def test_pack_unpack_roundtrip():
    allowed = torch.rand(5, 77, generator=torch.Generator().manual_seed(0)) < 0.5
    assert torch.equal(unpack_bitmask(pack(allowed), 77), allowed)


def test_greedy_is_exact_argmax_over_allowed_tokens():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 100, generator=g)
    logits[3, [5, 9]] = 50.0  # a tie: the lower index wins
    allowed = torch.rand(16, 100, generator=g) < 0.3
    allowed[3, [5, 9]] = True
    for mask in (None, pack(allowed)):
        ids, lp = sample(logits, mask, **params(16, temperature=0.0))
        ref_logits = logits if mask is None else logits.masked_fill(~allowed, float("-inf"))
        assert torch.equal(ids, ref_logits.argmax(-1))
        assert ids[3] == 5
        expected = torch.log_softmax(ref_logits, -1).gather(1, ids[:, None])[:, 0]
        torch.testing.assert_close(lp, expected)


def test_never_samples_a_masked_token():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 300, generator=g) * 3
    allowed = torch.rand(64, 300, generator=g) < 0.05
    allowed[:, 7] = True
    mask = pack(allowed)
    for seed0 in range(0, 2000, 64):
        ids, _ = sample(logits, mask, **params(64, temperature=1.5, seed0=seed0))
        assert allowed[torch.arange(64), ids].all()


def test_all_masked_row_is_an_error():
    allowed = torch.ones(3, 40, dtype=torch.bool)
    allowed[1] = False
    with pytest.raises(ValueError, match="row 1 allows no token"):
        sample(torch.randn(3, 40), pack(allowed), **params(3))


def test_top_k_one_is_greedy_and_top_k_stays_in_the_top():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(32, 50, generator=g)
    ids, _ = sample(logits, None, **params(32, top_k=1))
    assert torch.equal(ids, logits.argmax(-1))
    top5 = logits.topk(5).indices
    for seed0 in range(0, 640, 32):
        ids, _ = sample(logits, None, **params(32, top_k=5, seed0=seed0))
        assert (top5 == ids[:, None]).any(-1).all()


def test_reproducible_per_seed_whatever_the_batch():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(8, 64, generator=g)
    p = params(8, seed0=100)
    ids, _ = sample(logits, None, **p)
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
    """The filtered, renormalised distribution, written independently of the kernel."""
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
