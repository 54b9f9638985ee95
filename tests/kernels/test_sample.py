"""The fused Triton sampling kernel against its twin, kernels.reference.sample."""

from __future__ import annotations

import pytest
import torch
from test_reference_sample import chi2_pvalue, pack, params, reference_distribution

from braid.kernels import reference
from braid.kernels.triton.sampling import sample


def on(device: str, p: dict) -> dict:
    return {k: v.to(device) for k, v in p.items()}


def mixed_params(b: int, seed0: int = 0) -> dict:
    """Rows cycling through greedy, plain, top-k, top-p, min-p and all three at once."""
    p = params(b, seed0=seed0)
    p["temperature"][0::6] = 0.0
    p["temperature"][1::6] = 0.7
    p["top_k"][2::6] = 3
    p["top_p"][3::6] = 0.6
    p["min_p"][4::6] = 0.3
    p["top_k"][5::6], p["top_p"][5::6], p["min_p"][5::6] = 20, 0.9, 0.05
    return p


def test_same_tokens_and_logprobs_as_the_twin(device):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(48, 300, generator=g) * 2
    allowed = torch.rand(48, 300, generator=g) < 0.3
    allowed[:, 0] = True
    for mask in (None, pack(allowed)):
        p = mixed_params(48, seed0=11)
        ids, lp = sample(
            logits.to(device), None if mask is None else mask.to(device), **on(device, p)
        )
        ref_ids, ref_lp = reference.sample(logits, mask, **p)
        assert torch.equal(ids.cpu(), ref_ids)
        torch.testing.assert_close(lp.cpu(), ref_lp, atol=1e-5, rtol=1e-5)


def test_rows_longer_than_a_block_match_the_twin(device):
    # 5000 tokens are three of the kernel's blocks: maxima, ties and race winners are carried
    # from block to block.
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(12, 5000, generator=g) * 2
    logits[0, [100, 4500]] = 50.0  # a greedy tie across blocks: the lower index wins
    logits[6, [4500, 2100]] = 50.0
    allowed = torch.rand(12, 5000, generator=g) < 0.5
    allowed[[0, 0, 6, 6], [100, 4500, 4500, 2100]] = True
    p = mixed_params(12, seed0=5)
    ids, lp = sample(logits.to(device), pack(allowed).to(device), **on(device, p))
    ref_ids, ref_lp = reference.sample(logits, pack(allowed), **p)
    assert ids[0] == 100 and ids[6] == 2100
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(lp.cpu(), ref_lp, atol=1e-5, rtol=1e-5)


def test_never_samples_a_masked_token(device):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(256, 96, generator=g) * 3
    allowed = torch.rand(256, 96, generator=g) < 0.05
    allowed[:, 7] = True
    # A padded vocabulary: 100 logits, a mask of 96 tokens; 96..99 do not exist for it.
    wide = torch.cat([logits, torch.full((256, 4), 50.0)], dim=1)
    p = mixed_params(256, seed0=3)
    p["temperature"][1::2] = 1.5
    ids, _ = sample(wide.to(device), pack(allowed).to(device), **on(device, p))
    assert allowed[torch.arange(256), ids.cpu()].all()


def test_greedy_is_exact_argmax_with_its_logprob(device):
    g = torch.Generator().manual_seed(1)
    # A strided view, as the runtime passes logits[:, :vocab]; ties go to the lower index.
    logits = torch.randn(16, 120, generator=g)[:, :100]
    logits[3, [5, 9]] = 50.0
    logits[4, [70, 12]] = 50.0
    allowed = torch.rand(16, 100, generator=g) < 0.3
    allowed[3:5, [5, 9, 12, 70]] = True
    for mask in (None, pack(allowed)):
        p = params(16, temperature=0.0)
        ids, lp = sample(
            logits.to(device), None if mask is None else mask.to(device), **on(device, p)
        )
        masked = logits if mask is None else logits.masked_fill(~allowed, float("-inf"))
        assert torch.equal(ids.cpu(), masked.argmax(-1))
        assert ids[3] == 5 and ids[4] == 12
        torch.testing.assert_close(lp.cpu(), reference.sample(logits, mask, **p)[1])


def test_reproducible_per_seed_whatever_the_batch(device):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(12, 64, generator=g).to(device)
    p = on(device, mixed_params(12, seed0=100))
    ids, _ = sample(logits, None, **p)
    assert torch.equal(sample(logits, None, **p)[0], ids)
    one = {k: v[7:8] for k, v in p.items()}
    assert sample(logits[7:8], None, **one)[0].item() == ids[7].item()
    rev = {k: v.flip(0) for k, v in p.items()}
    assert torch.equal(sample(logits.flip(0), None, **rev)[0], ids.flip(0))
    flat = torch.zeros(200, 1000, device=device)
    assert sample(flat, None, **on(device, params(200)))[0].unique().numel() > 150


def test_a_row_allowing_nothing_gets_minus_one(device):
    allowed = torch.ones(3, 40, dtype=torch.bool)
    allowed[1] = False
    ids, lp = sample(
        torch.randn(3, 40, device=device), pack(allowed).to(device), **on(device, params(3))
    )
    assert ids[1] == -1 and lp[1] == float("-inf") and (ids[[0, 2]] >= 0).all()


FILTERS = [dict(top_k=5), dict(top_p=0.7), dict(min_p=0.2), dict(top_k=8, top_p=0.9, min_p=0.1)]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f))
def test_sampled_distribution_matches_the_reference(device, filters):
    n, vocab = 4000, 16
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(5)) * 1.5
    p = params(n, temperature=0.7, **filters)
    ids, lp = sample(logits.expand(n, vocab).to(device), None, **on(device, p))
    ids, lp = ids.cpu(), lp.cpu()
    expected = reference_distribution(logits, 0.7, **filters)
    counts = torch.bincount(ids, minlength=vocab).float()
    assert counts[expected == 0].sum() == 0
    assert chi2_pvalue(counts, expected * n) > 1e-3
    torch.testing.assert_close(lp, expected[ids].log())
    # negative control: the unfiltered distribution must be rejected
    assert chi2_pvalue(counts, reference_distribution(logits, 0.7) * n) < 1e-6
