"""Fused sampling: bitmask, temperature, top-k, top-p, min-p and the seeded draw in one kernel.

Semantics are `kernels.reference.sample`'s. Instead of sorting a row, the kernel finds the
top-k and top-p cut values by bisection over the float bits of the logprobs (32 steps at
most, each a pass over the row, only for rows that turn a filter on), so the kept set is the
twin's exactly: every token whose logprob is >= the cut, ties included. The draw is the
twin's exponential race over the same counter-based noise, so a row and its seed give the
twin's token (up to float rounding of near-tied races: the log-sum-exp is summed in another
order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# float32 -inf as an order key (see _key): below every finite logprob.
_KEY_NEG_INF: tl.constexpr = tl.constexpr(-2139095041)


@triton.jit
def _key(x):
    """float32 -> int64 with the same order (for non-NaN x): negatives get their low 31 bits
    flipped, so larger magnitudes sort lower."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)


@triton.jit
def _unkey(key):
    """The inverse of _key (the flip is its own inverse and keeps the sign bit)."""
    bits = key.to(tl.int32)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.float32, bitcast=True)


@triton.jit
def _fmix32(h):
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _logprobs(
    logits_ptr, mask_ptr, rows, row_ok, cols, stride, mask_words, V, t, lse, HAS_MASK: tl.constexpr
):
    """Masked logits / t - lse for a [ROWS, BLOCK_V] tile; -inf where masked or past V."""
    ok = row_ok[:, None] & (cols[None, :] < V)
    rows = rows.to(tl.int64)  # B * V can pass 2**31
    x = tl.load(logits_ptr + rows[:, None] * stride + cols[None, :], mask=ok, other=0.0)
    x = x.to(tl.float32)
    if HAS_MASK:
        word_ok = ok & (cols[None, :] // 32 < mask_words)
        words = tl.load(mask_ptr + rows[:, None] * mask_words + cols[None, :] // 32, mask=word_ok)
        ok = word_ok & (((words >> (cols[None, :] % 32)) & 1) != 0)
    return tl.where(ok, x / t[:, None] - lse[:, None], float("-inf"))


@triton.jit
def _sample_kernel(
    logits_ptr,
    stride,
    mask_ptr,
    mask_words,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seed_ptr,
    ids_ptr,
    lp_ptr,
    B,
    V,
    HAS_MASK: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    row_ok = rows < B
    cols0 = tl.arange(0, BLOCK_V)
    temp = tl.load(temp_ptr + rows, mask=row_ok, other=0.0)
    greedy = temp == 0
    t = tl.where(greedy, 1.0, temp)  # a greedy row's logprob is at temperature 1
    zero = tl.zeros([ROWS], tl.float32)

    # Pass 1: max, first argmax and sum of exp of the row at temperature t (online softmax).
    m = zero + float("-inf")
    s = zero
    best = tl.zeros([ROWS], tl.int64) - 1
    for start in range(0, V, BLOCK_V):
        cols = start + cols0
        y = _logprobs(
            logits_ptr, mask_ptr, rows, row_ok, cols, stride, mask_words, V, t, zero, HAS_MASK
        )
        block_max = tl.max(y, axis=1)
        block_arg = tl.argmax(y, axis=1).to(tl.int64) + start
        m_new = tl.maximum(m, block_max)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(y - m_safe[:, None]), axis=1)
        best = tl.where(block_max > m, block_arg, best)  # strict: the lowest index wins ties
        m = m_new
    dead = m == float("-inf")  # the row allows no token (or is past B)
    lse = tl.where(dead, 0.0, m + tl.log(tl.where(dead, 1.0, s)))
    lp_max = tl.where(dead, float("-inf"), m - lse)

    # top-k cut: the largest key v with count(key >= v) >= k, i.e. the k-th best logprob.
    # Masked tokens count as -inf, as in the twin's sort, so k past the allowed tokens keeps all.
    k = tl.load(top_k_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    sampled = row_ok & ~greedy & ~dead
    k_on = sampled & (k > 0) & (k < V)
    lo = tl.zeros([ROWS], tl.int64) + _KEY_NEG_INF
    hi = tl.where(k_on, _key(lp_max), lo)
    while tl.max(hi - lo) > 0:
        mid = lo + (hi - lo + 1) // 2
        count = tl.zeros([ROWS], tl.int64)
        for start in range(0, V, BLOCK_V):
            cols = start + cols0
            lp = _logprobs(
                logits_ptr, mask_ptr, rows, row_ok, cols, stride, mask_words, V, t, lse, HAS_MASK
            )
            inside = (cols[None, :] < V) & (_key(lp) >= mid[:, None])
            count += tl.sum(inside.to(tl.int64), axis=1)
        lo = tl.where(count >= k, mid, lo)
        hi = tl.where(count >= k, hi, mid - 1)
    k_cut = _unkey(lo)

    # top-p cut, on the distribution renormalised after top-k: the smallest kept value v with
    # mass(lp > v) < top_p * mass(kept), which is the twin's last position whose mass before
    # it is < top_p.
    top_p = tl.load(top_p_ptr + rows, mask=row_ok, other=1.0)
    p_on = sampled & (top_p < 1)
    p_cut = zero + float("-inf")
    if tl.max(p_on.to(tl.int32)) != 0:
        z = zero
        for start in range(0, V, BLOCK_V):
            cols = start + cols0
            lp = _logprobs(
                logits_ptr, mask_ptr, rows, row_ok, cols, stride, mask_words, V, t, lse, HAS_MASK
            )
            z += tl.sum(tl.where(lp >= k_cut[:, None], tl.exp(lp), 0.0), axis=1)
        lo = tl.where(p_on, _key(k_cut), _key(lp_max))
        hi = _key(lp_max)
        while tl.max(hi - lo) > 0:
            mid = lo + (hi - lo) // 2
            above = zero
            for start in range(0, V, BLOCK_V):
                cols = start + cols0
                lp = _logprobs(
                    logits_ptr,
                    mask_ptr,
                    rows,
                    row_ok,
                    cols,
                    stride,
                    mask_words,
                    V,
                    t,
                    lse,
                    HAS_MASK,
                )
                keep = (lp >= k_cut[:, None]) & (_key(lp) > mid[:, None])
                above += tl.sum(tl.where(keep, tl.exp(lp), 0.0), axis=1)
            fits = above < top_p * z
            hi = tl.where(fits, mid, hi)
            lo = tl.where(fits, lo, mid + 1)
        p_cut = tl.where(p_on, _unkey(hi), p_cut)

    # min-p keeps p >= min_p * p_max; min_p 0 keeps everything.
    min_p = tl.load(min_p_ptr + rows, mask=row_ok, other=0.0)
    p_bound = tl.where(min_p > 0, lp_max + tl.log(tl.where(min_p > 0, min_p, 1.0)), float("-inf"))
    cut = tl.maximum(tl.maximum(k_cut, p_cut), p_bound)

    # The exponential race argmax lp - log(-log U) over the kept tokens, U from the twin's
    # hash of (seed, token): seed halves -> row = fmix(lo ^ fmix(hi)), h = fmix(row ^ t * phi).
    seed = tl.load(seed_ptr + rows, mask=row_ok, other=0)
    seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    seed_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    row_hash = _fmix32(seed_lo ^ _fmix32(seed_hi))
    race_max = zero + float("-inf")
    winner = best
    winner_lp = lp_max
    z_kept = zero
    if tl.max(sampled.to(tl.int32)) != 0:
        for start in range(0, V, BLOCK_V):
            cols = start + cols0
            lp = _logprobs(
                logits_ptr, mask_ptr, rows, row_ok, cols, stride, mask_words, V, t, lse, HAS_MASK
            )
            lp = tl.where(lp >= cut[:, None], lp, float("-inf"))
            h = _fmix32(row_hash[:, None] ^ (cols[None, :].to(tl.uint32) * 0x9E3779B9))
            u = ((h >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08  # 2**-24
            race = lp - tl.log(-tl.log(u))
            block_max = tl.max(race, axis=1)
            block_arg = tl.argmax(race, axis=1)
            block_lp = tl.max(tl.where(cols0[None, :] == block_arg[:, None], lp, float("-inf")), 1)
            better = block_max > race_max
            winner = tl.where(better, block_arg.to(tl.int64) + start, winner)
            winner_lp = tl.where(better, block_lp, winner_lp)
            race_max = tl.maximum(race_max, block_max)
            z_kept += tl.sum(tl.exp(lp), axis=1)
    ids = tl.where(sampled, winner, best)
    lps = tl.where(sampled, winner_lp - tl.log(tl.where(sampled, z_kept, 1.0)), lp_max)
    tl.store(ids_ptr + rows, tl.where(dead, -1, ids), mask=row_ok)
    tl.store(lp_ptr + rows, lps, mask=row_ok)


def sample(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [B, V]; returns (token ids int64 [B], logprobs fp32 [B]).

    As `kernels.reference.sample`, except that a row allowing no token gets id -1 (and logprob
    -inf) instead of an error: raising would need the host to wait for the device. The caller
    checks the ids it reads back anyway.
    """
    num_rows, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ids = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    lps = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
    if num_rows == 0:
        return ids, lps
    block_v = min(triton.next_power_of_2(vocab), 2048)
    # Rows per program: one or two for a real vocabulary; many for a small one, so that a
    # program still holds a few thousand elements.
    rows = min(max(1, 4096 // block_v), triton.next_power_of_2(num_rows))
    has_mask = bitmask is not None
    mask = bitmask.contiguous() if has_mask else ids  # a placeholder pointer, never read
    _sample_kernel[(triton.cdiv(num_rows, rows),)](
        logits,
        logits.stride(0),
        mask,
        bitmask.shape[1] if has_mask else 0,
        temperature.float().contiguous(),
        top_k.contiguous(),
        top_p.float().contiguous(),
        min_p.float().contiguous(),
        seeds.to(torch.int64).contiguous(),
        ids,
        lps,
        num_rows,
        vocab,
        HAS_MASK=has_mask,
        ROWS=rows,
        BLOCK_V=block_v,
        num_warps=8,  # a tile is up to 4096 elements and the pass keeps several of them live
    )
    return ids, lps
