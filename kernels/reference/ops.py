"""Plain-PyTorch twins of the Triton kernels, with the same signatures and semantics.

They define what the kernels must compute, are the tests' references, and are what the
runtime calls on the CPU. The sampling kernel's twin is the CPU sampler itself
(sampling.py beside this), so the kernel is tested against exactly what the CPU runs.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


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


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
):
    """softmax(q k^T * scale) v in fp32 over visible keys: q [n, H, D], k/v [L, Hkv, D],
    visible bool [n, L]; each KV head serves H / Hkv consecutive query heads. `softcap`:
    scores become softcap * tanh(score / softcap) first. `sinks` [H]: each head's logit that
    joins the softmax's denominator without a value (GPT-OSS)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # (H, L, D)
    v = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(q.float().transpose(0, 1), k.transpose(1, 2)) * scale  # (H, n, L)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~visible, _NEG_INF)
    if sinks is not None:  # a column per head that no value follows
        sink = sinks.float().to(q.device)[:, None, None].expand(*scores.shape[:2], 1)
        scores = torch.cat([scores, sink], dim=-1)  # (H, n, L + 1)
    probs = scores.softmax(-1)[..., : k.shape[1]]
    return torch.matmul(probs, v).transpose(0, 1).to(q.dtype)  # (n, H, D)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its slots in the KV pool.

    q: [B, H, D]; k_cache, v_cache: [S, Hkv, D]; sequence b's context lives in slots
    kv_indices[kv_indptr[b]:kv_indptr[b + 1]]. Returns [B, H, D]. `num_splits` is the kernel's
    speed knob; the result does not depend on it. `window`: only the last `window` slots are
    seen; `softcap`: scores become softcap * tanh(score / softcap); `sinks` (float32 [H]):
    each head's logit added to the softmax's denominator as e^sink (GPT-OSS).
    """
    out = torch.empty_like(q)
    bounds = kv_indptr.tolist()
    for b in range(q.shape[0]):
        slots = kv_indices[bounds[b] : bounds[b + 1]]
        visible = torch.ones(1, slots.numel(), dtype=torch.bool, device=q.device)
        if window is not None:
            visible[:, : max(0, slots.numel() - window)] = False
        out[b] = _attend(
            q[b : b + 1], k_cache[slots], v_cache[slots], visible, scale, softcap, sinks
        )[0]
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
    window: int | None = None,
    softcap: float | None = None,
    positions: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of the new tokens of B sequences over their cached prefix and each other.

    q: [T, H, D], sequence b's n_b new tokens in rows qo_indptr[b]:qo_indptr[b + 1]; its
    context (prefix, then the new tokens, already stored) in slots
    kv_indices[kv_indptr[b]:kv_indptr[b + 1]]. The prefix is always visible; among the new
    tokens i sees j when j <= i, or, given mask (bool/uint8 [sum(n_b * n_b)], sequence b's
    row-major n_b x n_b block after those of the sequences before it), when mask[i, j] is set.
    `max_new` is the kernel's hint; unused here. `window`: a new token at position p sees
    the keys at positions above p - window (a prefix key's position is its index; with
    `mask`, the new tokens' are `positions` [T], else prefix + i). `softcap`: scores become
    softcap * tanh(score / softcap). `sinks` (float32 [H]): each head's logit added to the
    softmax's denominator as e^sink (GPT-OSS). Returns [T, H, D].
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
        if window is not None:
            q_pos = torch.arange(prefix, prefix + n, device=q.device)
            if mask is not None:
                q_pos = positions[q0:q1].to(q.device)
            k_pos = torch.cat([torch.arange(prefix, device=q.device), q_pos])
            visible &= q_pos[:, None] - k_pos[None, :] < window
        out[q0:q1] = _attend(
            q[q0:q1], k_cache[slots], v_cache[slots], visible, scale, softcap, sinks
        )
    return out


# kernels/cpu/quant.py's formats: bytes a block, weights a block.
_BLOCKS = {
    "q4": (20, 32), "q5": (24, 32), "q6": (14, 16), "q8": (18, 16), "iq4": (18, 32),
    "mxfp4": (17, 32),
}  # fmt: skip
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def dequantize(blocks: torch.Tensor, fmt: str, in_features: int) -> torch.Tensor:
    """A quantized weight (kernels/cpu/quant.py's `fmt` blocks, uint8 [N, row bytes]) as float32
    [N, in_features]."""
    n = blocks.shape[0]
    size, weights = _BLOCKS[fmt]
    b = blocks.reshape(n, in_features // weights, size)
    if fmt == "mxfp4":  # an E8M0 exponent byte e, then the nibbles: w = value * 2^(e - 128)
        e = b[..., :1].to(torch.int32)
        bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)  # 2^(e - 128), denormals too
        qs = b[..., 1:].to(torch.int32)
        values = torch.tensor(MXFP4_VALUES)[torch.cat([qs & 15, qs >> 4], dim=-1)].float()
        return (values * bits.view(torch.float32)).reshape(n, in_features)
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


def lora_rows(
    x: torch.Tensor,
    y: torch.Tensor,
    adapters: torch.Tensor,
    pairs: list[tuple[torch.Tensor, torch.Tensor] | None],
) -> None:
    """y [T, out] += B_i @ (A_i @ x[t]) in place for each row t of x [T, in] whose adapter
    i = adapters[t] (int [T]) is not -1 and whose pairs[i] = (A [R, in], B [out, R]) is not
    None (the adapter leaves this linear alone). The CPU kernel's twin (kernels/cpu/cpu_lora.cpp),
    every row its own adapter where lora_segmented takes runs of rows."""
    for i, pair in enumerate(pairs):
        rows = (adapters == i).nonzero().flatten()
        if pair is not None and rows.numel():
            a, b = pair
            y.index_add_(0, rows, (x[rows] @ a.T) @ b.T)  # (L, R) @ (R, out)
