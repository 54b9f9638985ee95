"""Sliding-window and soft-capped attention (Mistral, Gemma): the twins' window against
attention over the cut context, the Triton kernels against the twins (in triton's interpreter
without a GPU), and every attention backend against the twin on mixed batches."""

from __future__ import annotations

import pytest
import torch
from test_attention import extend_case, pool, ragged, tree_masks
from test_runtime_attention import CASES, batch_and_inputs
from test_runtime_attention import pool as kv_pool

from braid.kernels import reference
from braid.kernels.triton.decode import decode_attention
from braid.kernels.triton.extend import extend_attention
from braid.runtime.attention.triton import TritonAttention
from braid.runtime.models.layers.ops import TORCH_OPS, layer_ops

HEAD_DIM = 16
OPTIONS = pytest.mark.parametrize(
    "window, softcap", [(6, None), (15, None), (7, 1.5), (None, 1.5)],
    ids=["window6", "window15", "window7-softcap", "softcap"],
)  # fmt: skip


def test_twin_decode_window_is_attention_over_the_last_slots():
    k_cache, v_cache = pool(2, "cpu")
    lengths = [1, 5, 70, 131]
    kv_indptr, kv_indices = ragged(lengths, "cpu")
    q = torch.randn(len(lengths), 4, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    got = reference.decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices, 0.3, window=9)
    bounds = kv_indptr.tolist()
    for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        cut = torch.tensor([0, min(hi - lo, 9)], dtype=torch.int32)
        slots = kv_indices[max(lo, hi - 9) : hi]
        want = reference.decode_attention(q[b : b + 1], k_cache, v_cache, cut, slots, 0.3)
        torch.testing.assert_close(got[b : b + 1], want)


def test_twin_extend_window_row_is_a_decode_over_its_window():
    shapes, args = extend_case("cpu", 4, 2)
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, scale = args
    got = reference.extend_attention(*args, window=10)
    for b, (prefix, n) in enumerate(shapes):
        slots = kv_indices[kv_indptr[b] : kv_indptr[b + 1]]
        for i in range(n):
            end = prefix + i + 1  # this token's context, itself included
            cut = slots[max(0, end - 10) : end]
            row = qo_indptr[b] + i
            bounds = torch.tensor([0, cut.numel()], dtype=torch.int32)
            want = reference.decode_attention(
                q[row : row + 1], k_cache, v_cache, bounds, cut, scale
            )
            torch.testing.assert_close(got[row : row + 1], want)


@OPTIONS
def test_decode_kernel_matches_twin(device, window, softcap):
    lengths = [1, 5, 70, 131]
    k_cache, v_cache = pool(2, device)
    kv_indptr, kv_indices = ragged(lengths, device)
    q = torch.randn(len(lengths), 4, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    args = (q.to(device), k_cache, v_cache, kv_indptr, kv_indices, 0.5)
    options = dict(window=window, softcap=softcap)
    out = decode_attention(*args, num_splits=3, **options)
    torch.testing.assert_close(
        out, reference.decode_attention(*args, **options), atol=1e-3, rtol=1e-3
    )


@OPTIONS
def test_extend_kernel_matches_twin(device, window, softcap):
    shapes, args = extend_case(device, 4, 2)
    options = dict(window=window, softcap=softcap)
    out = extend_attention(*args, **options)
    want = reference.extend_attention(*args, **options)
    torch.testing.assert_close(out, want, atol=1e-3, rtol=1e-3)
    if window is not None:  # the window changes the result
        assert not torch.allclose(out, reference.extend_attention(*args, softcap=softcap))


@pytest.mark.parametrize("window", [5, 30])
def test_extend_kernel_tree_window_matches_twin(device, window):
    shapes, args = extend_case(device, 4, 2)
    mask = tree_masks(shapes)
    # Each tree node's position: the prefix plus its depth.
    depths = torch.cat([mask[s : s + n * n].view(n, n).sum(1) - 1 for s, n in _blocks(shapes)])
    positions = torch.cat(
        [p + depths[q0 : q0 + n] for (p, n), q0 in zip(shapes, _starts(shapes), strict=True)]
    )
    options = dict(mask=mask.to(device), window=window, positions=positions.to(device))
    out = extend_attention(*args, **options)
    torch.testing.assert_close(
        out, reference.extend_attention(*args, **options), atol=1e-3, rtol=1e-3
    )


def _blocks(shapes):
    start = 0
    for _, n in shapes:
        yield start, n
        start += n * n


def _starts(shapes):
    return [sum(n for _, n in shapes[:i]) for i in range(len(shapes))]


def expected(batch, q, k, v, window, softcap):
    kv = kv_pool("cpu")
    reference.store_kv(k, v, kv.k[0], kv.v[0], batch.out_slots)
    meta = TritonAttention().prepare(batch)
    out = reference.extend_attention(
        q, kv.k[0], kv.v[0], meta.qo_indptr, meta.kv_indptr, batch.kv_indices, 0.25,
        meta.tree_mask, window=window, softcap=softcap, positions=batch.positions,
    )  # fmt: skip
    return out.flatten(1), kv


@OPTIONS
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("cpu_kernels", [False, True], ids=["torch", "cpu-kernels"])
def test_cpu_backends_equal_the_twin(name, cpu_kernels, window, softcap):
    ops = layer_ops(torch.device("cpu"), torch.float32, cpu_kernels)
    if cpu_kernels and ops is TORCH_OPS:
        pytest.skip("the CPU kernels cannot be built here")
    batch, q, k, v = batch_and_inputs(name, "cpu")
    want, kv = expected(batch, q, k, v, window, softcap)
    out = ops.attention.attend(q, kv, 0, batch, 0.25, window, softcap)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window, softcap", [(6, None), (7, 1.5)], ids=["window", "both"])
@pytest.mark.parametrize("name", ["hybrid", "decode", "tree"])
def test_triton_backend_equals_the_twin(device, name, window, softcap):
    batch, q, k, v = batch_and_inputs(name, device)
    want, _ = expected(batch_and_inputs(name, "cpu")[0], q, k, v, window, softcap)
    kv = kv_pool(device)
    reference.store_kv(k.to(device), v.to(device), kv.k[0], kv.v[0], batch.out_slots)
    out = TritonAttention().attend(q.to(device), kv, 0, batch, 0.25, window, softcap)
    torch.testing.assert_close(out.cpu(), want, atol=1e-3, rtol=1e-3)
