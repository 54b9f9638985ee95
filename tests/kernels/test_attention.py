"""The paged attention kernels and the fused RoPE + KV store against their twins in
kernels.reference."""

from __future__ import annotations

import pytest
import torch

from braid.kernels import reference
from braid.kernels.triton.decode import decode_attention
from braid.kernels.triton.extend import extend_attention
from braid.kernels.triton.rope import rope_store_kv

NUM_SLOTS, HEAD_DIM = 256, 16


def pool(num_kv_heads: int, device: str, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(NUM_SLOTS, num_kv_heads, HEAD_DIM, generator=g).to(device, dtype)
    v = torch.randn(NUM_SLOTS, num_kv_heads, HEAD_DIM, generator=g).to(device, dtype)
    return k, v


def ragged(lengths: list[int], device: str, seed: int = 1):
    """Each sequence gets its own scattered slots: (indptr [B + 1], indices [sum L]) int32."""
    perm = torch.randperm(NUM_SLOTS, generator=torch.Generator().manual_seed(seed))
    indices = perm[: sum(lengths)].to(torch.int32)
    indptr = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    return indptr.to(device), indices.to(device)


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, num_splits",
    [(4, 1, 1), (4, 2, 3), (6, 6, 8)],
    ids=["mqa-1split", "gqa-3splits", "mha-8splits"],
)
def test_decode_attention_matches_twin(device, num_heads, num_kv_heads, num_splits):
    # Ragged lengths: shorter than the number of splits, one KV block, several blocks.
    lengths = [1, 5, 70, 131]
    k_cache, v_cache = pool(num_kv_heads, device)
    kv_indptr, kv_indices = ragged(lengths, device)
    q = torch.randn(len(lengths), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    q = q.to(device)
    args = (q, k_cache, v_cache, kv_indptr, kv_indices, HEAD_DIM**-0.5)
    out = decode_attention(*args, num_splits=num_splits)
    torch.testing.assert_close(out, reference.decode_attention(*args), atol=1e-3, rtol=1e-3)


def extend_case(device: str, num_heads: int, num_kv_heads: int):
    # (cached prefix, new tokens): a decode row, a prefill from scratch, a chunk over a prefix
    # that spans two query blocks.
    shapes = [(40, 1), (0, 9), (75, 37)]
    lengths = [p + n for p, n in shapes]
    k_cache, v_cache = pool(num_kv_heads, device, seed=3)
    kv_indptr, kv_indices = ragged(lengths, device, seed=4)
    qo_indptr = torch.tensor([0] + [n for _, n in shapes]).cumsum(0).to(torch.int32).to(device)
    q = torch.randn(
        int(qo_indptr[-1]), num_heads, HEAD_DIM, generator=torch.Generator().manual_seed(5)
    )
    return shapes, (q.to(device), k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, 0.3)


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (3, 1)], ids=["gqa", "mqa-odd-group"])
def test_extend_attention_causal_matches_twin(device, num_heads, num_kv_heads):
    _, args = extend_case(device, num_heads, num_kv_heads)
    out = extend_attention(*args)
    torch.testing.assert_close(out, reference.extend_attention(*args), atol=1e-3, rtol=1e-3)


def test_extend_decode_rows_equal_decode_attention(device):
    lengths = [3, 64, 100]
    k_cache, v_cache = pool(2, device, seed=6)
    kv_indptr, kv_indices = ragged(lengths, device, seed=7)
    q = torch.randn(3, 4, HEAD_DIM, generator=torch.Generator().manual_seed(8)).to(device)
    qo_indptr = torch.arange(4, dtype=torch.int32, device=device)
    extend = extend_attention(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, 0.25)
    decode = decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices, 0.25, num_splits=4)
    torch.testing.assert_close(extend, decode, atol=1e-3, rtol=1e-3)


def tree_masks(shapes) -> torch.Tensor:
    """Per sequence an ancestor-or-self matrix of a random tree over its new tokens."""
    g = torch.Generator().manual_seed(9)
    blocks = []
    for _, n in shapes:
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
        m = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            m[i] |= m[parent[i]]
        blocks.append(m.flatten())
    return torch.cat(blocks)


def test_extend_attention_tree_mask_matches_twin(device):
    shapes, args = extend_case(device, 4, 2)
    mask = tree_masks(shapes).to(device)
    out = extend_attention(*args, mask=mask)
    expected = reference.extend_attention(*args, mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-3, rtol=1e-3)
    # The tree mask really changes the result (else the test could pass by ignoring it).
    assert not torch.allclose(out, reference.extend_attention(*args), atol=1e-2)
    # A lower-triangular mask is the causal case.
    causal = torch.cat([torch.ones(n, n, dtype=torch.bool).tril().flatten() for _, n in shapes])
    torch.testing.assert_close(
        extend_attention(*args, mask=causal.to(device)),
        reference.extend_attention(*args),
        atol=1e-3,
        rtol=1e-3,
    )


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, dtype, tol",
    [(4, 1, torch.float32, 1e-6), (6, 2, torch.float32, 1e-6), (4, 2, torch.bfloat16, 1e-2)],
    ids=["mqa-fp32", "gqa-fp32", "gqa-bf16"],
)
def test_rope_store_kv_matches_twin(device, num_heads, num_kv_heads, dtype, tol):
    k_cache, v_cache = pool(num_kv_heads, device, seed=12, dtype=dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    g = torch.Generator().manual_seed(13)
    qkv = torch.randn(5, (num_heads + 2 * num_kv_heads) * HEAD_DIM, generator=g).to(device, dtype)
    expected_qkv = qkv.clone()
    angles = torch.outer(torch.arange(100.0), 0.7 ** torch.arange(HEAD_DIM // 2.0))
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    positions = torch.tensor([0, 99, 17, 18, 42], device=device)
    slots = torch.tensor([7, 200, 3, 64, 65], device=device)
    args = (num_heads, num_kv_heads, positions, cos, sin)
    rope_store_kv(qkv, *args, k_cache, v_cache, slots)
    reference.rope_store_kv(expected_qkv, *args, expected_k, expected_v, slots)
    torch.testing.assert_close(qkv, expected_qkv, atol=tol, rtol=tol)
    torch.testing.assert_close(k_cache, expected_k, atol=tol, rtol=tol)  # other slots too
    assert torch.equal(v_cache, expected_v)  # copied, not computed
