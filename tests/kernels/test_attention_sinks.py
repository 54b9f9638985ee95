"""Attention sinks (GPT-OSS: a per-head logit in the softmax's denominator, without a value):
the twins against the formula, the Triton kernels against the twins (in triton's interpreter
without a GPU), and every attention backend against the twin on mixed batches."""

from __future__ import annotations

import pytest
import torch
from test_attention import HEAD_DIM, extend_case, pool, ragged, tree_masks
from test_attention_window import expected
from test_runtime_attention import CASES, batch_and_inputs
from test_runtime_attention import pool as kv_pool

from braid.kernels import reference
from braid.kernels.triton.decode import decode_attention
from braid.kernels.triton.extend import extend_attention
from braid.runtime.attention.triton import TritonAttention
from braid.runtime.models.layers.ops import TORCH_OPS, layer_ops

OPTIONS = pytest.mark.parametrize(
    "window, softcap", [(None, None), (6, None), (7, 1.5)], ids=["sinks", "window", "softcap"]
)


def sinks(num_heads: int, seed: int = 9) -> torch.Tensor:
    """Sink logits around the scores' size, one large enough to take most of its head's
    weight."""
    s = torch.randn(num_heads, generator=torch.Generator().manual_seed(seed))
    s[0] = 4.0
    return s


def test_twin_decode_divides_by_the_sink_too():
    k_cache, v_cache = pool(2, "cpu")
    lengths = [1, 5, 70]
    kv_indptr, kv_indices = ragged(lengths, "cpu")
    q = torch.randn(len(lengths), 4, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    sink = sinks(4)
    got = reference.decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices, 0.3, sinks=sink)
    bounds = kv_indptr.tolist()
    for b in range(len(lengths)):
        slots = kv_indices[bounds[b] : bounds[b + 1]]
        k = k_cache[slots].repeat_interleave(2, dim=1)  # (L, H, D)
        v = v_cache[slots].repeat_interleave(2, dim=1)
        e = torch.einsum("hd,lhd->hl", q[b], k).mul(0.3).exp()  # (H, L)
        want = torch.einsum("hl,lhd->hd", e, v) / (e.sum(-1) + sink.exp())[:, None]
        torch.testing.assert_close(got[b], want, atol=1e-5, rtol=1e-5)
    # Without the sinks the rows differ (the sinks took weight).
    plain = reference.decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices, 0.3)
    assert not torch.allclose(got, plain, atol=1e-3)


@OPTIONS
def test_decode_kernel_matches_twin(device, window, softcap):
    lengths = [1, 5, 70, 131]
    k_cache, v_cache = pool(2, device)
    kv_indptr, kv_indices = ragged(lengths, device)
    q = torch.randn(len(lengths), 4, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    args = (q.to(device), k_cache, v_cache, kv_indptr, kv_indices, 0.5)
    options = dict(window=window, softcap=softcap, sinks=sinks(4).to(device))
    want = reference.decode_attention(*args, **options)
    for num_splits in (1, 3):  # the sink is counted once, by the first split
        out = decode_attention(*args, num_splits=num_splits, **options)
        torch.testing.assert_close(out, want, atol=1e-3, rtol=1e-3)


@OPTIONS
def test_extend_kernel_matches_twin(device, window, softcap):
    _, args = extend_case(device, 4, 2)
    options = dict(window=window, softcap=softcap, sinks=sinks(4).to(device))
    out = extend_attention(*args, **options)
    torch.testing.assert_close(
        out, reference.extend_attention(*args, **options), atol=1e-3, rtol=1e-3
    )


def test_extend_kernel_tree_matches_twin(device):
    shapes, args = extend_case(device, 3, 1)
    options = dict(mask=tree_masks(shapes).to(device), sinks=sinks(3).to(device))
    out = extend_attention(*args, **options)
    torch.testing.assert_close(
        out, reference.extend_attention(*args, **options), atol=1e-3, rtol=1e-3
    )


def test_kernels_refuse_sinks_of_another_shape_or_dtype(device):
    _, args = extend_case(device, 4, 2)
    with pytest.raises(ValueError, match="float32 \\[4\\]"):
        extend_attention(*args, sinks=torch.zeros(4, dtype=torch.bfloat16, device=device))
    q, k_cache, v_cache, _, kv_indptr, kv_indices, scale = args
    with pytest.raises(ValueError, match="float32 \\[4\\]"):
        decode_attention(q[:3], k_cache, v_cache, kv_indptr, kv_indices, scale, sinks=sinks(3))


def _expected(batch, q, k, v, window, softcap, sink):
    kv = kv_pool("cpu")
    reference.store_kv(k, v, kv.k[0], kv.v[0], batch.out_slots)
    meta = TritonAttention().prepare(batch)
    out = reference.extend_attention(
        q, kv.k[0], kv.v[0], meta.qo_indptr, meta.kv_indptr, batch.kv_indices, 0.25,
        meta.tree_mask, window=window, softcap=softcap, positions=batch.positions, sinks=sink,
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
    want, kv = _expected(batch, q, k, v, window, softcap, sinks(4))
    out = ops.attention.attend(q, kv, 0, batch, 0.25, window, softcap, sinks(4))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    # The sinks change the result (the test would see a backend that drops them).
    plain, _ = expected(batch, q, k, v, window, softcap)
    assert not torch.allclose(out, plain, atol=1e-3)


@pytest.mark.parametrize("window", [None, 6], ids=["sinks", "window"])
@pytest.mark.parametrize("name", ["hybrid", "decode", "tree"])
def test_triton_backend_equals_the_twin(device, name, window):
    batch, q, k, v = batch_and_inputs(name, device)
    want, _ = _expected(batch_and_inputs(name, "cpu")[0], q, k, v, window, None, sinks(4))
    kv = kv_pool(device)
    reference.store_kv(k.to(device), v.to(device), kv.k[0], kv.v[0], batch.out_slots)
    out = TritonAttention().attend(
        q.to(device), kv, 0, batch, 0.25, window, None, sinks(4).to(device)
    )
    torch.testing.assert_close(out.cpu(), want, atol=1e-3, rtol=1e-3)
