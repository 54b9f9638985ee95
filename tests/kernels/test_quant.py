"""Quantized weights (kernels/quant.py, kernels/cpu_quant.cpp): packing, GGUF conversion, and
the CPU kernels against their PyTorch twins."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from braid.kernels import cpu, quant, reference

T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def lib():
    lib = cpu.load()
    if lib is None:
        pytest.skip("the CPU kernels cannot be built here")
    return lib


@pytest.mark.parametrize("fmt", [quant.Q4, quant.Q8], ids=lambda f: f.name)
def test_packing_rounds_each_weight_to_its_blocks_grid(fmt):
    w = torch.randn(20, 96) * torch.linspace(0.01, 3, 96)  # blocks of very different ranges
    blocks = quant.quantize(w, fmt)
    assert blocks.dtype == torch.uint8 and blocks.shape == (20, fmt.row_bytes(96))
    got = reference.dequantize(blocks, fmt.name, 96)
    groups = w.reshape(20, -1, fmt.block)
    # The float16 scale, rounded up from the range's: 16 levels between each block's min and
    # max (q4), or 255 symmetric around 0 (q8).
    scale = torch.from_numpy(blocks.numpy().view(fmt.dtype)["scale"].astype(np.float32))
    levels = groups.amax(-1) - groups.amin(-1) if fmt is quant.Q4 else groups.abs().amax(-1)
    assert (scale >= levels / (15 if fmt is quant.Q4 else 127)).all()
    assert (scale <= levels / (15 if fmt is quant.Q4 else 127) * (1 + 2**-9) + 1e-7).all()
    err = (got - w).abs().reshape(20, -1, fmt.block)
    assert (err <= scale[..., None] / 2 + 1e-6).all()


@pytest.mark.parametrize("fmt", [quant.Q4, quant.Q8], ids=lambda f: f.name)
@pytest.mark.parametrize(
    "m, n, k", [(1, 7, 64), (2, 8, 96), (3, 5, 32), (4, 9, 64), (5, 13, 128), (64, 40, 256)]
)
def test_quant_matmul_equals_its_twin(lib, fmt, m, n, k):
    """Decode rows (x rounded to int8) against quant_matmul_int8, more rows against
    quant_matmul; both against the float product within the rounding's bound."""
    blocks = quant.quantize(torch.randn(n, k), fmt)
    x = torch.randn(m, k)
    got = lib.quant_matmul(x, quant.interleave(blocks, fmt), fmt.name, n)
    rounded = m <= lib.quant_int8_max_rows
    twin = reference.quant_matmul_int8 if rounded else reference.quant_matmul
    torch.testing.assert_close(got, twin(x, blocks, fmt.name), atol=1e-4, rtol=1e-5)
    # Each input moves by at most half its block's step (amax / 127) when rounded.
    step = x.reshape(m, -1, fmt.block).abs().amax(-1) / 127
    w = reference.dequantize(blocks, fmt.name, k).reshape(n, -1, fmt.block)
    bound = torch.einsum("mb,nb->mn", step / 2, w.abs().sum(-1)) if rounded else 0
    exact = x.double() @ w.reshape(n, k).double().T
    assert ((got.double() - exact).abs() <= bound + 1e-4).all()


def test_quant_matmul_int8_rounds_like_its_twin(lib):
    """Inputs on a block's rounding boundaries (ties to even), zero blocks and huge inputs,
    through an identity weight so each output is one rounded input: a single input rounded
    the other way moves its output by a whole step (>= 1/127 of it)."""
    if lib.quant_int8_max_rows == 0:
        pytest.skip("no int8 decode path on this CPU")
    blocks = quant.quantize(torch.eye(64), quant.Q8)
    x = torch.zeros(2, 64)
    x[0, :16] = torch.arange(16) - 7.5  # exact halves once scaled by 127 / amax = 1:
    x[0, 0] = 127.0  # 0.5 -> 0, 1.5 -> 2, -2.5 -> -2 to nearest even
    x[0, 16:32] = 1e30
    x[1, 32:] = torch.linspace(-1, 1, 32)
    torch.testing.assert_close(
        lib.quant_matmul(x, quant.interleave(blocks, quant.Q8), "q8", 64),
        reference.quant_matmul_int8(x, blocks, "q8"),
        atol=0,
        rtol=1e-5,
    )


@pytest.mark.parametrize("fmt", [quant.Q4, quant.Q8], ids=lambda f: f.name)
def test_dequantized_rows_equal_the_twins(lib, fmt):
    blocks = quant.quantize(torch.randn(30, 64), fmt)
    packed = quant.interleave(blocks, fmt)
    assert packed.shape == (32, blocks.shape[1])  # 30 rows in 4 groups of 8
    ids = torch.tensor([0, 29, 7, 7, 8, 15])
    torch.testing.assert_close(
        lib.dequantize_rows(packed, fmt.name, (30, 64), ids),
        reference.dequantize(blocks, fmt.name, 64)[ids],
        atol=0,
        rtol=0,
    )
    with pytest.raises(ValueError, match="ids outside"):
        lib.dequantize_rows(packed, fmt.name, (30, 64), torch.tensor([30]))
    with pytest.raises(ValueError, match="groups of 8"):  # rows not interleaved
        lib.dequantize_rows(blocks, fmt.name, (30, 64), ids)


def gguf_blocks(ggml_type, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGUF blocks [n, row bytes], their float weight [n, k]): quantized by the gguf
    package where it can, else random blocks of the type (their scales kept finite)."""
    rng = np.random.default_rng(seed)
    if ggml_type in (T.Q4_0, T.Q4_1, T.Q8_0):
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), ggml_type)
    else:
        block, size = gguf.GGML_QUANT_SIZES[ggml_type]
        raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
        halves = raw.view(np.float16)  # the fp16 scales: small finite values
        if ggml_type == T.Q4_K:  # d and dmin lead each block
            halves[..., :2] = rng.uniform(0.001, 0.01, halves[..., :2].shape)
        else:  # Q6_K: d closes each block
            halves[..., -1] = rng.uniform(0.001, 0.01, halves[..., -1].shape)
        raw = raw.reshape(n, -1)
    return raw, np.asarray(gguf.quants.dequantize(raw, ggml_type), dtype=np.float32)


@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=str)
def test_gguf_blocks_convert_into_our_formats(ggml_type):
    raw, weight = gguf_blocks(ggml_type, 6, 512)
    fmt, blocks = quant.from_gguf(raw, ggml_type, (6, 512))
    got = reference.dequantize(blocks, fmt.name, 512).numpy()
    if ggml_type in (T.Q4_0, T.Q4_1, T.Q8_0):  # the same grid: exact but for fp16 scales
        np.testing.assert_allclose(got, weight, atol=1e-6, rtol=1e-6)
    else:  # packed again from the floats: within half a step of the new grid
        groups = weight.reshape(6, -1, fmt.block)
        spread = np.ptp(groups, -1) / 15 if fmt is quant.Q4 else np.abs(groups).max(-1) / 127
        err = np.abs(got - weight).reshape(6, -1, fmt.block)
        assert (err <= spread[..., None] / 2 + 1e-6).all()


def test_a_type_without_a_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="Q5_K"):
        quant.from_gguf(np.zeros((1, 176), np.uint8), T.Q5_K, (1, 256))
