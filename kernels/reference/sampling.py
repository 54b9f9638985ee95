"""Sampling in plain PyTorch: what the runtime runs where the fused Triton kernel
(kernels/triton/sampling.py) does not, i.e. on the CPU, and that kernel's twin (kernels.reference
re-exports `sample`): the kernel reproduces its mask, filters, noise and draw.

Apart from kernels/triton/sampling.py, which imports triton, so that the CPU path never loads it.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_NEG_INF = float("-inf")


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [B, W] -> bool [B, vocab_size]: bit t % 32 of word t // 32 allows token t.

    Bits past vocab_size are ignored; tokens t >= 32 * W (a logits row wider than the mask,
    e.g. a padded lm_head) do not exist for the grammar, so they come back disallowed.
    """
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    # `& 1` after the shift because >> on int32 is arithmetic: bit 31 would smear otherwise.
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).flatten(1).bool()  # (B, W, 32) -> (B, 32W)
    missing = vocab_size - allowed.shape[1]
    if missing > 0:
        allowed = torch.nn.functional.pad(allowed, (0, missing), value=False)
    return allowed[:, :vocab_size]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """A copy of logits [B, V] with the tokens bitmask disallows at -inf."""
    return logits.masked_fill(~unpack_bitmask(bitmask, logits.shape[-1]), _NEG_INF)


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """h * c mod 2**32 for int64 h in [0, 2**32) and a uint32 constant c.

    The product is split at c's 16-bit halves so no intermediate exceeds 2**49: int64
    overflow (undefined in C++) is never relied on, and the result is exactly the wrapping
    uint32 multiply a Triton kernel does.
    """
    lo = h * (c & 0xFFFF)
    hi = ((h * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding uint32 values."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniform_noise(seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """U(0, 1) float32 [B, vocab_size] from a counter-based hash of (row seed, token index).

    In uint32 arithmetic (all products mod 2**32), with seed_lo/seed_hi the low/high 32 bits
    of the int64 seed (two's complement):
        row = fmix32(seed_lo ^ fmix32(seed_hi))
        h   = fmix32(row ^ (t * 0x9E3779B9))
        u   = (2 * (h >> 9) + 1) * 2**-24
    so u is an odd multiple of 2**-24 in [2**-24, 1 - 2**-24]: never 0 or 1, and exact in
    float32 (the integer is < 2**24, the scale a power of two). A row's noise depends only
    on its seed, not on the batch around it.
    """
    seeds = seeds.to(torch.int64)
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    row = _fmix32(lo ^ _fmix32(hi)).unsqueeze(1)  # (B, 1)
    t = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    h = _fmix32(row ^ _mul32(t, 0x9E3779B9))  # (B, V)
    return (2 * (h >> 9) + 1).to(torch.float32) * 2.0**-24


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

    Order: bitmask (-inf), temperature, then top-k, top-p and min-p, each on the distribution
    left by the previous step, renormalised. Temperature 0 is greedy: the lowest-index argmax
    over the allowed tokens, whose logprob is the log-softmax of the masked raw logits
    (temperature 1, no filters). A sampled row's logprob is that of its token under the
    final, filtered and renormalised distribution. A row that allows no token (masked, or
    all -inf) gets token -1 and logprob -inf.

    top_k <= 0 or >= V, top_p >= 1 and min_p <= 0 switch a filter off. top-k and top-p cut
    at a probability value, so a token tied with the last one kept is kept too: ties at the
    boundary keep a few extra, whatever order a sort put them in.

    The draw is an exponential race, argmax p_i / E_i with E_i = -log U_i, which picks token
    i with probability p_i; U comes from `uniform_noise(seeds)`, so a row's token depends only
    on its logits, parameters and seed. The caller varies the seed per step.
    """
    logits = logits.float()
    if bitmask is not None:
        logits = apply_bitmask(logits, bitmask)
    chosen = logits.argmax(dim=-1)
    chosen_lp = logits.gather(1, chosen.unsqueeze(1)).squeeze(1) - logits.logsumexp(dim=-1)
    rows = (temperature != 0).nonzero().squeeze(1)
    if rows.numel():  # the noise and the filters cost O(V) per row: only for sampled rows
        ids, lp = _sample_rows(
            logits[rows], temperature[rows], top_k[rows], top_p[rows], min_p[rows], seeds[rows]
        )
        chosen[rows], chosen_lp[rows] = ids, lp
    dead = torch.isneginf(logits.gather(1, chosen.unsqueeze(1)).squeeze(1))
    chosen[dead], chosen_lp[dead] = -1, float("-inf")  # rows that allow no token
    return chosen, chosen_lp


def _sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample` for rows with temperature != 0.

    Filters only ever put -inf into `kept`; they never renormalise it, because the race and
    the min-p ratio do not change when a row is shifted by a constant. So a row that no filter
    touches keeps exactly the same values, and draws exactly the same token, whether or not
    other rows in the batch took the sorting path. Renormalisation happens once, for the
    returned logprob.
    """
    kept = filtered_logprobs(logits, temperature, top_k, top_p, min_p)
    sampled = race(kept, seeds)
    chosen = kept.gather(1, sampled.unsqueeze(1)).squeeze(1)
    return sampled, chosen - kept.logsumexp(dim=-1)


def race(logp: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """The exponential race over unnormalised log-probabilities [B, V]: argmax log(p_i / E_i),
    E_i = -log U_i with each row's noise from its seed. Returns the drawn ids [B]."""
    return (logp - torch.log(-torch.log(uniform_noise(seeds, logp.shape[1])))).argmax(dim=-1)


def filtered_logprobs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """log-softmax(logits / temperature) [B, V] with the tokens top-k, top-p and min-p drop at
    -inf, NOT renormalised (see `_sample_rows`): the distribution `sample` draws from, up to
    a constant per row. Rows must have temperature != 0.
    """
    vocab = logits.shape[1]
    logprobs = torch.log_softmax(logits / temperature.unsqueeze(1), dim=-1)
    kept = logprobs
    k_on = (top_k > 0) & (top_k < vocab)
    p_on = top_p < 1
    if bool((k_on | p_on).any()):
        sorted_lp = logprobs.sort(dim=-1, descending=True).values  # (B, V)
        k = torch.where(k_on, top_k, vocab).to(torch.int64)
        k_cut = sorted_lp.gather(1, (k - 1).unsqueeze(1))  # (B, 1): the k-th best logprob
        # top-p sees the distribution renormalised after top-k, still in sorted order.
        probs = torch.softmax(sorted_lp.masked_fill(sorted_lp < k_cut, _NEG_INF), dim=-1)
        # Keep a position while the mass strictly before it is < p: the smallest prefix
        # reaching p. The count, unlike the cumsum's last bits, ignores how ties were ordered.
        before = probs.cumsum(dim=-1) - probs
        n = (before < top_p.unsqueeze(1)).sum(dim=-1).clamp(min=1)
        n = torch.where(p_on, n, vocab)  # a cumsum that rounds to >= 1.0 must not cut when off
        p_cut = sorted_lp.gather(1, (n - 1).unsqueeze(1))  # (B, 1)
        kept = logprobs.masked_fill(logprobs < torch.maximum(k_cut, p_cut), _NEG_INF)
    if bool((min_p > 0).any()):
        # p < min_p * p_max in log space; min_p = 0 gives a -inf bound that drops nothing.
        bound = kept.max(dim=-1, keepdim=True).values + torch.log(min_p).unsqueeze(1)
        kept = kept.masked_fill(kept < bound, _NEG_INF)
    return kept
