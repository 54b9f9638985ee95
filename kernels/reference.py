"""Plain-PyTorch twins of the Triton kernels, with the same signatures and semantics.

They define what the kernels must compute, are the tests' references, and are what the
runtime calls on the CPU.
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


def add_rms_norm(
    x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += x (in place; skipped when x is None), then weight * rmsnorm(residual).

    As transformers' LlamaRMSNorm: the variance in float32, the normalised value cast back to
    the residual's dtype before the weight multiplies it. x, residual: [..., dim].
    """
    if x is not None:
        residual.add_(x)
    h = residual.float()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(residual.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rope(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    """Rotate the q and k heads of qkv [T, (H + 2 Hkv) * D] in place, in the half-split layout:
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) with cos/sin [P, D / 2] at each token's
    position (in qkv's dtype, as transformers applies them)."""
    head_dim = 2 * cos.shape[-1]
    qk = qkv.view(qkv.shape[0], -1, head_dim)[:, : num_heads + num_kv_heads]  # (T, H+Hkv, D)
    c = cos[positions].unsqueeze(1).to(qkv.dtype)  # (T, 1, D/2)
    s = sin[positions].unsqueeze(1).to(qkv.dtype)
    x1, x2 = qk.chunk(2, dim=-1)
    qk.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))


def rope_store_kv(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """`rope` on qkv, then its k and v heads written into `slots` of the pool [S, Hkv, D]."""
    rope(qkv, num_heads, num_kv_heads, positions, cos, sin)
    heads = qkv.view(qkv.shape[0], -1, k_cache.shape[-1])  # (T, H + 2 Hkv, D)
    kv = heads[:, num_heads:]
    store_kv(kv[:, :num_kv_heads], kv[:, num_kv_heads:], k_cache, v_cache, slots)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Write the new tokens' k, v [T, Hkv, D] into slots [T] of the pool [S, Hkv, D]."""
    k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.index_copy_(0, slots, v.to(v_cache.dtype))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float):
    """softmax(q k^T * scale) v in fp32 over visible keys: q [n, H, D], k/v [L, Hkv, D],
    visible bool [n, L]; each KV head serves H / Hkv consecutive query heads."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # (H, L, D)
    v = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(q.float().transpose(0, 1), k.transpose(1, 2)) * scale  # (H, n, L)
    probs = scores.masked_fill(~visible, _NEG_INF).softmax(-1)
    return torch.matmul(probs, v).transpose(0, 1).to(q.dtype)  # (n, H, D)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its slots in the KV pool.

    q: [B, H, D]; k_cache, v_cache: [S, Hkv, D]; sequence b's context lives in slots
    kv_indices[kv_indptr[b]:kv_indptr[b + 1]]. Returns [B, H, D]. `num_splits` is the kernel's
    speed knob; the result does not depend on it.
    """
    out = torch.empty_like(q)
    bounds = kv_indptr.tolist()
    for b in range(q.shape[0]):
        slots = kv_indices[bounds[b] : bounds[b + 1]]
        visible = torch.ones(1, slots.numel(), dtype=torch.bool, device=q.device)
        out[b] = _attend(q[b : b + 1], k_cache[slots], v_cache[slots], visible, scale)[0]
    return out


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    max_new: int | None = None,
) -> torch.Tensor:
    """Attention of the new tokens of B sequences over their cached prefix and each other.

    q: [T, H, D], sequence b's n_b new tokens in rows qo_indptr[b]:qo_indptr[b + 1]; its
    context (prefix, then the new tokens, already stored) in slots
    kv_indices[kv_indptr[b]:kv_indptr[b + 1]]. The prefix is always visible; among the new
    tokens i sees j when j <= i, or, given mask (bool/uint8 [sum(n_b * n_b)], sequence b's
    row-major n_b x n_b block after those of the sequences before it), when mask[i, j] is set.
    `max_new` is the kernel's hint; unused here. Returns [T, H, D].
    """
    out = torch.empty_like(q)
    q_bounds, kv_bounds = qo_indptr.tolist(), kv_indptr.tolist()
    mask_start = 0
    for b in range(len(q_bounds) - 1):
        q0, q1 = q_bounds[b], q_bounds[b + 1]
        n = q1 - q0
        slots = kv_indices[kv_bounds[b] : kv_bounds[b + 1]]
        prefix = slots.numel() - n
        visible = torch.ones(n, slots.numel(), dtype=torch.bool, device=q.device).tril(prefix)
        if mask is not None:
            block = mask[mask_start : mask_start + n * n].view(n, n).bool()
            visible[:, prefix:] = block
            mask_start += n * n
        out[q0:q1] = _attend(q[q0:q1], k_cache[slots], v_cache[slots], visible, scale)
    return out


# kernels/quant.py's formats: bytes a block, weights a block.
_BLOCKS = {"q4": (20, 32), "q5": (24, 32), "q6": (14, 16), "q8": (18, 16), "iq4": (18, 32)}
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def dequantize(blocks: torch.Tensor, fmt: str, in_features: int) -> torch.Tensor:
    """A quantized weight (kernels/quant.py's `fmt` blocks, uint8 [N, row bytes]) as float32
    [N, in_features]."""
    n = blocks.shape[0]
    size, weights = _BLOCKS[fmt]
    b = blocks.reshape(n, in_features // weights, size)
    scale = b[..., :2].view(torch.float16).float()
    if fmt == "q8":  # 16 int8
        return (b[..., 2:].view(torch.int8).float() * scale).reshape(n, in_features)
    if fmt == "q6":  # bits 2u, 2u + 1 of qh byte k: the top bits of weight 4u + k
        qh, qs = b[..., 2:6].to(torch.int32), b[..., 6:].to(torch.int32)
        low = torch.cat([qs & 15, qs >> 4], dim=-1)  # weight j, then weight j + 8
        top = (qh[..., None, :] >> (2 * torch.arange(4))[:, None]) & 3  # [n, blocks, u, k]
        q = low | (top.reshape(*low.shape) << 4)
        return ((q - 32).float() * scale).reshape(n, in_features)
    qs = b[..., -16:].to(torch.int32)
    q = torch.cat([qs & 15, qs >> 4], dim=-1)  # weight j, then weight j + 16
    if fmt == "iq4":
        return (torch.tensor(IQ4_VALUES)[q].float() * scale).reshape(n, in_features)
    if fmt == "q5":  # bit 2c + h of qh byte k: the fifth bit of weight 16h + 4c + k
        qh = b[..., 4:8].to(torch.int32)  # [n, blocks, k]
        shifts = 2 * torch.arange(4)[:, None] + torch.arange(2)[:, None, None]  # [h, c, 1]
        bits = (qh[..., None, None, :] >> shifts) & 1  # [n, blocks, h, c, k]
        q = q | (bits.reshape(*q.shape) << 4)
    low = b[..., 2:4].view(torch.float16).float()
    return (q.float() * scale + low).reshape(n, in_features)


def quant_matmul(x: torch.Tensor, blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """x [M, K] @ the quantized weight [N, K] transposed -> float32 [M, N]."""
    return x.float() @ dequantize(blocks, fmt, x.shape[-1]).T


def quant_matmul_int8(x: torch.Tensor, blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """quant_matmul with x first rounded to int8 in blocks of the weight format's size, one
    scale (amax / 127) a block: what the CPU kernel computes for decode rows."""
    block = _BLOCKS[fmt][1]
    groups = x.float().reshape(x.shape[0], -1, block)
    amax = groups.abs().amax(-1, keepdim=True)
    # A true division, as the kernel's (torch computes scalar / tensor through a reciprocal,
    # which moves inputs on a rounding tie by an ulp).
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, 0.0)
    rounded = (groups * inv).round() * (amax / 127.0)
    return quant_matmul(rounded.reshape(x.shape), blocks, fmt)


def lora_segmented(
    x: torch.Tensor,
    y: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    segments: torch.Tensor,
) -> None:
    """y [T, out] += each segment's LoRA update, in place: rows start..start+length-1 get
    (x[rows] @ a_stack[i].T) @ b_stack[i].T for the segment's adapter index i.

    x [T, in]; a_stack [N, R, in] and b_stack [N, out, R]: adapters of smaller rank padded
    with zeros up to R. segments int [S, 3], one (start, length, adapter index) a row, over
    disjoint row ranges. Rows in no segment are left as they are.
    """
    for start, length, i in segments.tolist():
        if length == 0:
            continue
        rows = slice(start, start + length)
        y[rows].addmm_(x[rows] @ a_stack[i].T, b_stack[i].T)  # (L, R) @ (R, out)
