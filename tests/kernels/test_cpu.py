"""The C++ CPU kernels (kernels/cpu/cpu.cpp) against their twins in kernels.reference."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import kernels_built_with

from braid.kernels import cpu, reference

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
# One bf16 rounding step apart at most: the kernels round where the twins do, but sum squares
# and dot products in another order.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=8e-3)}


@pytest.fixture(scope="module")
def lib() -> cpu.CpuKernels:
    kernels = cpu.load()
    assert kernels is not None, "the CPU kernels must build wherever a C++ compiler is found"
    return kernels


# The kernels have a path per vector unit: each is built here and checked, whichever this CPU
# would pick. The flags turn off what the next path up needs.
PATHS = {
    "native": (),
    "avx512-no-bf16-dot": ("-mno-avx512bf16",),
    "avx2": ("-mno-avx512f",),
    "portable": ("-mno-avx512f", "-mno-avx2"),
}


@pytest.fixture(scope="module", params=list(PATHS))
def path_lib(request) -> cpu.CpuKernels:
    return kernels_built_with(PATHS[request.param])


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# Rows of whole vectors take the vector paths; others the loops every path has.
DIMS = pytest.mark.parametrize("dim", [96, 100])


@DTYPES
@DIMS
@pytest.mark.parametrize("with_residual", [False, True], ids=["norm", "add-norm"])
def test_add_rms_norm(path_lib, threads, dtype, dim, with_residual):
    x, weight = randn(37, dim, dtype=dtype), randn(dim, dtype=dtype, seed=1)
    residual = randn(37, dim, dtype=dtype, seed=2) * 3
    ref_residual = residual.clone()
    got = path_lib.add_rms_norm(x if with_residual else None, residual, weight, 1e-5)
    want = reference.add_rms_norm(x if with_residual else None, ref_residual, weight, 1e-5)
    torch.testing.assert_close(residual, ref_residual, atol=0, rtol=0)  # the add rounds alike
    torch.testing.assert_close(got, want, **TOL[dtype])


@DTYPES
@DIMS
def test_silu_mul(path_lib, threads, dtype, dim):
    # Large magnitudes too: exp's clamps and the tails of silu.
    gate_up = torch.cat([randn(40, dim, dtype=dtype) * 4, randn(40, dim, dtype=dtype, seed=1)], 1)
    gate_up[0, :8] = torch.tensor([-200.0, -90.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 200.0])
    got = path_lib.silu_mul(gate_up)
    torch.testing.assert_close(got, reference.silu_mul(gate_up), **TOL[dtype])


@DTYPES
@pytest.mark.parametrize("head_dim", [32, 40])  # halves of a whole vector, and not
def test_rope_store_kv(path_lib, threads, dtype, head_dim):
    heads, kv_heads, tokens = 6, 2, 11
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    angles = torch.arange(64)[:, None] * 0.37 ** torch.arange(head_dim // 2)[None, :]
    cos, sin = angles.cos() * 1.1, angles.sin() * 1.1  # a scaled table, as yarn's
    positions = torch.randperm(64, generator=torch.Generator().manual_seed(3))[:tokens]
    slots = torch.randperm(40, generator=torch.Generator().manual_seed(4))[:tokens]
    caches = [randn(40, kv_heads, head_dim, dtype=dtype, seed=s) for s in (5, 6)]
    ref_qkv, ref_caches = qkv.clone(), [c.clone() for c in caches]
    path_lib.rope_store_kv(qkv, heads, kv_heads, positions, cos, sin, *caches, slots)
    reference.rope_store_kv(ref_qkv, heads, kv_heads, positions, cos, sin, *ref_caches, slots)
    torch.testing.assert_close(qkv, ref_qkv, **TOL[dtype])
    for got, want in zip(caches, ref_caches, strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(
        caches[0][untouched], randn(40, kv_heads, head_dim, dtype=dtype, seed=5)[untouched]
    )


@DTYPES
@pytest.mark.parametrize(
    "heads, kv_heads, head_dim",
    [(4, 2, 16), (6, 1, 64), (3, 3, 8), (6, 2, 128)],
    ids=["gqa", "mqa-d64", "mha-d8", "gqa-d128"],
)
def test_decode_attention(path_lib, threads, dtype, heads, kv_heads, head_dim):
    """Decode rows of a hybrid batch: some rows of q are not decodes and stay untouched; q is
    a strided view of qkv, as the model passes it. Rows past 256 slots are attended in chunks
    whose softmaxes are merged (the portable path)."""
    lengths = [1, 257, 700, 33]
    rows = torch.tensor([0, 3, 4, 9])  # rows 1, 2 and 5-8 belong to a prefill chunk
    tokens = 10
    qkv = randn(tokens, heads + 2 * kv_heads, head_dim, dtype=dtype)
    q = qkv[:, :heads]
    k_cache = randn(1000, kv_heads, head_dim, dtype=dtype, seed=1)
    v_cache = randn(1000, kv_heads, head_dim, dtype=dtype, seed=2)
    indices = torch.randperm(1000, generator=torch.Generator().manual_seed(3))[: sum(lengths)]
    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    out = torch.full((tokens, heads, head_dim), 7.0, dtype=dtype)
    path_lib.decode_attention(
        q, k_cache, v_cache, out, rows, starts, torch.tensor(lengths), indices, 0.3
    )
    indptr = torch.tensor([0, *lengths]).cumsum(0)
    want = reference.decode_attention(q[rows], k_cache, v_cache, indptr, indices, 0.3)
    torch.testing.assert_close(out[rows], want, **TOL[dtype])
    others = torch.ones(tokens, dtype=torch.bool)
    others[rows] = False
    assert bool((out[others] == 7.0).all())


@DTYPES
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(6, 2, 64), (4, 2, 16)], ids=["d64", "d16"])
def test_rope_store_attend_is_rope_store_then_attention(
    path_lib, threads, dtype, heads, kv_heads, head_dim
):
    """One call for both: every new token is rotated and stored before the decode rows attend,
    so a row sees its own new slot; rows 1, 2 and 5-8 only get RoPE and the store."""
    tokens, lengths, rows = 10, [1, 7, 300, 33], torch.tensor([0, 3, 4, 9])
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    angles = torch.arange(128)[:, None] * 0.37 ** torch.arange(head_dim // 2)[None, :]
    cos, sin = angles.cos(), angles.sin()
    positions = torch.randperm(128, generator=torch.Generator().manual_seed(3))[:tokens]
    caches = [randn(400, kv_heads, head_dim, dtype=dtype, seed=s) for s in (5, 6)]
    # Each decode row's table ends with the slot its token is stored in.
    slots = torch.randperm(400, generator=torch.Generator().manual_seed(4))[:tokens]
    others = torch.randperm(400, generator=torch.Generator().manual_seed(7))
    others = others[~torch.isin(others, slots)]
    tables, used = [], 0
    for row, n in zip(rows.tolist(), lengths, strict=True):
        tables.append(torch.cat([others[used : used + n - 1], slots[row : row + 1]]))
        used += n - 1
    indices = torch.cat(tables)
    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    ref_qkv, ref_caches = qkv.clone(), [c.clone() for c in caches]
    out = torch.full((tokens, heads, head_dim), 7.0, dtype=dtype)
    path_lib.rope_store_attend(
        qkv, heads, kv_heads, positions, cos, sin, *caches, slots,
        out, rows, starts, torch.tensor(lengths), indices, 0.3,
    )  # fmt: skip
    reference.rope_store_kv(ref_qkv, heads, kv_heads, positions, cos, sin, *ref_caches, slots)
    q = ref_qkv.view(tokens, -1, head_dim)[:, :heads]
    indptr = torch.tensor([0, *lengths]).cumsum(0)
    want = reference.decode_attention(q[rows], *ref_caches, indptr, indices, 0.3)
    torch.testing.assert_close(qkv, ref_qkv, **TOL[dtype])
    for got, ref in zip(caches, ref_caches, strict=True):
        torch.testing.assert_close(got, ref, **TOL[dtype])
    torch.testing.assert_close(out[rows], want, **TOL[dtype])
    untouched = torch.ones(tokens, dtype=torch.bool)
    untouched[rows] = False
    assert bool((out[untouched] == 7.0).all())


@pytest.mark.parametrize("head_dim", [16, 64])
def test_rows_over_a_shared_prefix_across_the_chunk_boundary(path_lib, threads, head_dim):
    """Draft-tree rows over one prefix (one group on the AVX-512 path), their lengths on both
    sides of 256 slots (one chunk, two), and past 512: the reference's results, and each row's
    the same bits as when it is attended alone."""
    heads, kv_heads = 6, 2
    k_cache, v_cache = (
        randn(4000, kv_heads, head_dim, seed=1),
        randn(4000, kv_heads, head_dim, seed=2),
    )
    pool = torch.randperm(4000, generator=torch.Generator().manual_seed(3))
    prefix, lengths = 254, [255, 256, 257, 258, 300, 513, 520, 255, 600, 256]
    own = [pool[prefix + 400 * i : prefix + 400 * i + n - prefix] for i, n in enumerate(lengths)]
    tables = [torch.cat([pool[:prefix], slots]) for slots in own]
    indices = torch.cat(tables)
    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    q = randn(len(lengths), heads, head_dim, seed=4)
    rows = torch.arange(len(lengths))
    out = torch.empty_like(q)
    path_lib.decode_attention(
        q, k_cache, v_cache, out, rows, starts, torch.tensor(lengths), indices, 0.3
    )
    indptr = torch.tensor([0, *lengths]).cumsum(0)
    want = reference.decode_attention(q, k_cache, v_cache, indptr, indices, 0.3)
    torch.testing.assert_close(out, want, **TOL[torch.float32])
    for i, table in enumerate(tables):
        alone = torch.empty_like(q[i : i + 1])
        path_lib.decode_attention(
            q[i : i + 1], k_cache, v_cache, alone, torch.tensor([0]), torch.tensor([0]),
            torch.tensor([len(table)]), table, 0.3,
        )  # fmt: skip
        assert torch.equal(alone[0], out[i]), f"row {i} ({lengths[i]} slots)"


@pytest.mark.parametrize("head_dim", [16, 64])
def test_results_do_not_depend_on_the_thread_count(path_lib, head_dim):
    """Each row (or chunk of a long row) is computed by one thread whole, chunks merged in a
    fixed order: the same bits with 1 or 2 threads."""
    q = randn(64, 4, head_dim)
    k_cache, v_cache = randn(2048, 2, head_dim, seed=1), randn(2048, 2, head_dim, seed=2)
    lengths = torch.randint(1, 8, (64,), generator=torch.Generator().manual_seed(3))
    lengths[0], lengths[5] = 600, 300
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    indices = torch.randperm(2048)[: int(lengths.sum())]
    outs = []
    before = torch.get_num_threads()
    for n in (1, 2):
        torch.set_num_threads(n)
        out = torch.empty_like(q)
        path_lib.decode_attention(
            q, k_cache, v_cache, out, torch.arange(64), starts, lengths, indices, 0.25
        )
        outs.append(out)
    torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


@DTYPES
def test_argmax_matches_torch(path_lib, threads, dtype):
    """Ties (the first index wins), -inf rows, NaN (its first index wins, as in torch), the
    maximum in the last partial chunk, and rows strided as a slice of wider logits."""
    wide = randn(11, 1000, dtype=dtype) * 3
    wide[1, [17, 500]] = 50.0  # a tie
    wide[9, [30, 69]] = 55.0  # a tie whose later index sits in an earlier lane
    wide[2, :] = float("-inf")
    wide[3, [40, 700]] = float("nan")
    wide[4, 997] = 80.0  # in the last, partial chunk of the row
    wide[5, 0] = 90.0
    wide[6, 999] = float("inf")
    wide[7, 990] = float("nan")  # a NaN only in the tail
    wide[8, [70, 975]] = 60.0  # a tie between a lane and the tail
    for x in (wide, wide[:, :997], wide[:, :40], wide[:, :9]):
        torch.testing.assert_close(path_lib.argmax(x), x.argmax(dim=-1), atol=0, rtol=0)
    with pytest.raises(ValueError, match="unit column stride"):
        path_lib.argmax(wide.t())


def lora_case(tokens: int, in_features: int, out_features: int, seed: int = 0):
    """Adapters of ranks 4, 8, 3 and 16 and one that leaves the linear alone (index 4), B
    column-major as lora_add reads it; the rank-8 one's B in two blocks, as a fused linear's
    (its first 4 rank columns on the first 40% of the rows, the others below; one column all
    zeros). Each token's adapter: runs of one at the start (whole and partial tiles of
    tokens), then interleaved at random, base rows (-1) among them."""
    g = torch.Generator().manual_seed(seed)
    pairs = [
        (randn(r, in_features, seed=seed + r), randn(r, out_features, seed=seed + 50 + r).T * 0.1)
        for r in (4, 8, 3, 16)
    ]
    split = out_features * 2 // 5
    pairs[1][1][split:, :4] = 0
    pairs[1][1][:split, 4:] = 0
    pairs[1][1][:, 6] = 0
    pairs.append(None)
    adapters = torch.randint(-1, len(pairs), (tokens,), generator=g)
    adapters[:11] = torch.tensor([0, 0, 0, 0, 1, 1, 1, -1, 3, 3, 2])[:tokens]
    spans = [cpu.lora_spans(p[1]) if p else None for p in pairs]
    packed = [
        cpu.lora_weights(*p, s) if p else (0, 0, 0, 0) for p, s in zip(pairs, spans, strict=True)
    ]
    table = torch.tensor(packed)
    return pairs, adapters, (table, spans)


@pytest.mark.parametrize(
    "tokens, in_features, out_features",
    [(1, 100, 72), (13, 100, 72), (300, 96, 130), (37, 576, 960)],
    ids=["decode-1", "ragged-widths", "long-rows-partial-chunk", "model-widths"],
)
def test_lora_add_matches_twin(path_lib, threads, tokens, in_features, out_features):
    pairs, adapters, (table, _spans) = lora_case(tokens, in_features, out_features)
    # x and y strided: column slices of wider rows, as a fused linear's parts would be.
    x = randn(tokens, in_features + 7, seed=1)[:, 3 : 3 + in_features]
    y = randn(tokens, out_features + 5, seed=2)[:, :out_features]
    want = y.clone()
    reference.lora_rows(x, want, adapters, pairs)
    before = y.clone()
    path_lib.lora_add(y, x, adapters, table)
    torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4)
    # Rows without an adapter, or whose adapter leaves the linear alone: untouched, bit for bit.
    untouched = (adapters < 0) | (adapters == len(pairs) - 1)
    assert torch.equal(y[untouched], before[untouched])


def test_lora_add_results_do_not_depend_on_the_thread_count(path_lib):
    """Each token's sums are one thread's, in a fixed order: the same bits with 1 or 2."""
    pairs, adapters, (table, _spans) = lora_case(64, 576, 1536, seed=3)
    x = randn(64, 576, seed=4)
    outs = []
    before = torch.get_num_threads()
    for n in (1, 2):
        torch.set_num_threads(n)
        y = randn(64, 1536, seed=5)
        path_lib.lora_add(y, x, adapters, table)
        outs.append(y)
    torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


def test_lora_spans_bound_each_rank_columns_nonzero_rows():
    b = torch.zeros(10, 3)
    b[2:5, 0], b[7, 0], b[0, 2], b[9, 2] = 1.0, -1.0, 2.0, 3.0
    assert cpu.lora_spans(b).tolist() == [[2, 8], [0, 0], [0, 10]]


def test_lora_add_refuses_what_it_cannot_read(lib):
    a, b = randn(4, 16), randn(8, 4)
    spans = cpu.lora_spans(b)
    with pytest.raises(ValueError, match="column-major"):
        cpu.lora_weights(a, b, spans)  # B row-major
    with pytest.raises(ValueError, match="float32"):
        cpu.lora_weights(a.to(torch.bfloat16), b.T.contiguous().T.to(torch.bfloat16), spans)
    with pytest.raises(ValueError, match="spans"):
        cpu.lora_weights(a, b.T.contiguous().T, spans[:2])
    table = torch.tensor([cpu.lora_weights(a, b.T.contiguous().T, spans)])
    with pytest.raises(ValueError, match="adapter index a token"):
        lib.lora_add(randn(3, 8), randn(3, 16), torch.zeros(2, dtype=torch.int64), table)
    with pytest.raises(ValueError, match="unit columns"):
        lib.lora_add(randn(8, 3).T, randn(3, 16), torch.zeros(3, dtype=torch.int64), table)


def test_bad_inputs_are_refused_by_name(lib):
    x = randn(4, 8)
    with pytest.raises(ValueError, match="contiguous CPU torch.float32"):
        lib.add_rms_norm(None, x.t(), randn(4), 1e-5)
    with pytest.raises(ValueError, match="got .*torch.float32"):
        lib.add_rms_norm(None, x.to(torch.bfloat16), randn(8), 1e-5)  # weight of another type
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        lib.silu_mul(x.double())
    with pytest.raises(ValueError, match="torch.int64"):
        lib.decode_attention(
            randn(1, 2, 4), randn(3, 1, 4), randn(3, 1, 4), randn(1, 2, 4),
            torch.tensor([0], dtype=torch.int32), torch.tensor([0]), torch.tensor([1]),
            torch.tensor([0]), 1.0,
        )  # fmt: skip


def test_without_a_compiler_load_returns_none(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="braid.kernels.cpu"):
        assert cpu.load(tmp_path / "build") is None
    assert "CPU kernels unavailable" in caplog.text
