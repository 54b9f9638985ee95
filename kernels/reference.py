"""Plain-PyTorch twins of the Triton kernels, with the same signatures and semantics.

They define what the kernels must compute, are the tests' references, and are what the
runtime calls on the CPU.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [B, W] -> bool [B, vocab_size]: bit t % 32 of word t // 32 allows token t."""
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = (bitmask.unsqueeze(-1) >> bits) & 1  # (B, W, 32)
    return allowed.flatten(1)[:, :vocab_size].bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """A copy of logits [B, V] with disallowed tokens at -inf."""
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    return logits.masked_fill(~allowed, float("-inf"))


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding uint32 values. Products are taken
    modulo 2**32 (int64 wraps on overflow and the low 32 bits are unaffected), so this is
    bit-for-bit the uint32 arithmetic a Triton kernel does."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def uniform_noise(seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """U(0, 1) [B, V] from a counter-based hash of (row seed, token index).

    h = fmix32(fmix32(seed_lo ^ fmix32(seed_hi)) ^ (t * 0x9E3779B9 mod 2**32)); the top 24 bits
    of h give u = (h >> 8 + 0.5) / 2**24, never 0 or 1. The same seed gives the same noise
    whatever the batch around the row.
    """
    seeds = seeds.to(torch.int64)
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    row = _fmix32(lo ^ _fmix32(hi)).unsqueeze(1)  # (B, 1)
    t = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    h = _fmix32(row ^ ((t * 0x9E3779B9) & _M32))  # (B, V)
    return ((h >> 8).to(torch.float32) + 0.5) / float(1 << 24)


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

    Order: bitmask, then temperature, then top-k, top-p and min-p, each on the distribution
    left by the previous step (renormalised). Temperature 0 is greedy: the lowest-index
    argmax over the allowed tokens, with the logprob of the masked raw logits. A sampled
    row's logprob is under the final, renormalised distribution. The draw is an
    exponential race, argmax p_i / E_i with E_i = -log U_i, which picks i with probability
    p_i, driven by `uniform_noise(seeds)`.
    """
    logits = logits.float()
    if bitmask is not None:
        logits = apply_bitmask(logits, bitmask)
        dead = torch.isneginf(logits).all(-1)
        if dead.any():
            row = int(dead.nonzero()[0])
            raise ValueError(f"sample: the bitmask of row {row} allows no token")
    chosen = logits.argmax(dim=-1)
    chosen_lp = logits.gather(1, chosen[:, None])[:, 0] - logits.logsumexp(dim=-1)
    rows = (temperature != 0).nonzero()[:, 0]
    if rows.numel():  # the noise and filters cost O(V) per row: only for sampled rows
        ids, lp = _sample_rows(
            logits[rows], temperature[rows], top_k[rows], top_p[rows], min_p[rows], seeds[rows]
        )
        chosen[rows], chosen_lp[rows] = ids, lp
    return chosen, chosen_lp


def _sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    vocab = logits.shape[1]
    logprobs = torch.log_softmax(logits / temperature.unsqueeze(1), dim=-1)
    k = torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k).to(torch.int64)
    filtered = logprobs
    if bool((k < vocab).any()) or bool((top_p < 1).any()):
        sorted_lp, order = logprobs.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        drop = ranks >= k.unsqueeze(1)  # top-k: keep the k best (ties broken by sort order)
        kept = sorted_lp.masked_fill(drop, float("-inf"))
        probs = torch.softmax(kept, dim=-1)
        # top-p: keep a token if the mass strictly before it is < p (so the first always stays)
        before = probs.cumsum(-1) - probs
        drop |= before >= top_p.unsqueeze(1)
        drop_unsorted = torch.zeros_like(drop).scatter(1, order, drop)
        filtered = torch.log_softmax(logprobs.masked_fill(drop_unsorted, float("-inf")), dim=-1)
    if bool((min_p > 0).any()):
        best = filtered.max(dim=-1, keepdim=True).values
        too_small = filtered < best + torch.log(min_p).unsqueeze(1)
        filtered = torch.log_softmax(filtered.masked_fill(too_small, float("-inf")), dim=-1)

    # Exponential race in log space: argmax log p - log E.
    race = filtered - torch.log(-torch.log(uniform_noise(seeds, vocab)))
    sampled = race.argmax(dim=-1)
    return sampled, filtered.gather(1, sampled.unsqueeze(1)).squeeze(1)
