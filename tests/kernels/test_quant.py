"""Quantized weights (kernels/cpu/quant.py, kernels/cpu/cpu_quant.cpp): packing, GGUF conversion,
and the CPU kernels against their PyTorch twins."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from conftest import kernels_built_with, random_gguf

from braid.kernels import cpu, reference
from braid.kernels.cpu import quant

T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def lib():
    lib = cpu.load()
    if lib is None:
        pytest.skip("the CPU kernels cannot be built here")
    return lib


# The quantized kernels have a path per vector unit: AVX-512 with VNNI (16-row groups), AVX2
# with AVX-VNNI, AVX2 with maddubs, and the portable expanding loop. Each is built and checked
# here, whichever this CPU would pick; the flags turn off what the next path up needs.
PATHS = {
    "native": (),
    "avx2": ("-mno-avx512f",),
    "avx2-no-vnni": ("-mno-avx512f", "-mno-avxvnni"),
    "portable": ("-mno-avx512f", "-mno-avx2"),
}


@pytest.fixture(scope="module", params=list(PATHS))
def path_lib(request) -> cpu.CpuKernels:
    return kernels_built_with(PATHS[request.param])


def random_blocks(fmt: quant.QuantFormat, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """n rows of random `fmt` blocks (any quant bytes; finite scales and mins of the sizes a
    model's weights have)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, k // fmt.block * fmt.block_bytes), dtype=np.uint8)
    records = blocks.view(fmt.dtype)
    if fmt is quant.MXFP4:  # exponents: scales 2^-10 .. 2^1 (times levels up to 12)
        records["e"] = rng.integers(118, 130, records.shape)
        return torch.from_numpy(blocks)
    records["scale"] = rng.uniform(-0.01, 0.01, records.shape)
    if "min" in fmt.dtype.names:
        records["min"] = rng.uniform(-0.1, 0.1, records.shape)
    return torch.from_numpy(blocks)


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


FORMATS = pytest.mark.parametrize("fmt", list(quant.FORMATS.values()), ids=lambda f: f.name)


@FORMATS
@pytest.mark.parametrize(
    "m, n, k",
    # The last rounds its inputs in parallel (M * K >= 2^16).
    [(1, 7, 64), (2, 8, 96), (3, 5, 32), (4, 9, 64), (5, 13, 128), (9, 17, 64), (300, 40, 256)],
)
def test_quant_matmul_equals_its_twin(path_lib, fmt, m, n, k):
    """Rows rounded to int8 (with AVX2) against quant_matmul_int8, else against quant_matmul;
    both against the float product within the rounding's bound."""
    if k % fmt.block:
        k = 2 * k
    blocks = random_blocks(fmt, n, k)
    # Seeded as the blocks are: the tolerance holds for these inputs on every run (an
    # unseeded draw once summed 1.4e-4 off, the float sums taken in another order).
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m * 1000 + k))
    packed = quant.interleave(blocks, fmt, path_lib.quant_group)
    got = path_lib.quant_matmul(x, packed, fmt.name, n)
    rounded = path_lib.quant_rounds_inputs
    twin = reference.quant_matmul_int8 if rounded else reference.quant_matmul
    torch.testing.assert_close(got, twin(x, blocks, fmt.name), atol=1e-4, rtol=1e-5)
    # Each input moves by at most half its block's step (amax / 127) when rounded.
    step = x.reshape(m, -1, fmt.block).abs().amax(-1) / 127
    w = reference.dequantize(blocks, fmt.name, k).reshape(n, -1, fmt.block)
    bound = torch.einsum("mb,nb->mn", step / 2, w.abs().sum(-1)) if rounded else 0
    exact = x.double() @ w.reshape(n, k).double().T
    assert ((got.double() - exact).abs() <= bound + 1e-4).all()


def test_quant_matmul_writes_into_a_column_slice(lib):
    """A stacked linear's parts (runtime/models/layers/quantized.py's QuantStack) each fill their
    columns of one output: the others stay as they were."""
    blocks = random_blocks(quant.Q4, 12, 64)
    packed = quant.interleave(blocks, quant.Q4, lib.quant_group)
    x = torch.randn(5, 64)
    out = torch.full((5, 20), 7.0)
    lib.quant_matmul(x, packed, "q4", 12, out[:, 3:15])
    torch.testing.assert_close(out[:, 3:15], lib.quant_matmul(x, packed, "q4", 12))
    assert (out[:, :3] == 7).all() and (out[:, 15:] == 7).all()


def test_quant_matmul_int8_rounds_like_its_twin(path_lib):
    """Inputs on a block's rounding boundaries (ties to even), zero blocks and huge inputs,
    through an identity weight so each output is one rounded input: a single input rounded
    the other way moves its output by a whole step (>= 1/127 of it)."""
    if not path_lib.quant_rounds_inputs:
        pytest.skip("this path does not round inputs")
    blocks = quant.quantize(torch.eye(64), quant.Q8)
    x = torch.zeros(2, 64)
    x[0, :16] = torch.arange(16) - 7.5  # exact halves once scaled by 127 / amax = 1:
    x[0, 0] = 127.0  # 0.5 -> 0, 1.5 -> 2, -2.5 -> -2 to nearest even
    x[0, 16:32] = 1e30
    x[1, 32:] = torch.linspace(-1, 1, 32)
    torch.testing.assert_close(
        path_lib.quant_matmul(
            x, quant.interleave(blocks, quant.Q8, path_lib.quant_group), "q8", 64
        ),
        reference.quant_matmul_int8(x, blocks, "q8"),
        atol=0,
        rtol=1e-5,
    )


@FORMATS
def test_dequantized_rows_equal_the_twins(lib, fmt):
    blocks = random_blocks(fmt, 30, 64)
    group = lib.quant_group
    packed = quant.interleave(blocks, fmt, group)
    assert packed.shape == (-(-30 // group) * group, blocks.shape[1])
    ids = torch.tensor([0, 29, 7, 7, 8, 15])
    torch.testing.assert_close(
        lib.dequantize_rows(packed, fmt.name, (30, 64), ids),
        reference.dequantize(blocks, fmt.name, 64)[ids],
        atol=0,
        rtol=0,
    )
    with pytest.raises(ValueError, match="ids outside"):
        lib.dequantize_rows(packed, fmt.name, (30, 64), torch.tensor([30]))
    with pytest.raises(ValueError, match=f"groups of {group}"):  # rows not interleaved
        lib.dequantize_rows(blocks, fmt.name, (30, 64), ids)


def gguf_blocks(ggml_type, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(random GGUF blocks [n, row bytes] of the type, finite scales; their float weight
    [n, k] as the gguf package dequantizes them)."""
    rng = np.random.default_rng(seed)
    raw = random_gguf().random_matrix(rng, ggml_type, n, k, 0.05)
    return raw, np.asarray(gguf.quants.dequantize(raw, ggml_type), dtype=np.float32)


GGUF_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]


@pytest.mark.parametrize("ggml_type", GGUF_TYPES, ids=str)
def test_gguf_blocks_convert_into_our_formats(ggml_type):
    """Each type's weights as the gguf package dequantizes them: exactly where its factors
    are float16 already, else within float16 rounding of each block's scale and min."""
    raw, weight = gguf_blocks(ggml_type, 6, 512)
    fmt, blocks = quant.from_gguf(raw, ggml_type, (6, 512))
    assert blocks.shape == (6, fmt.row_bytes(512))
    got = reference.dequantize(blocks, fmt.name, 512).numpy()
    if ggml_type in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL):
        np.testing.assert_array_equal(got, weight)
    else:
        rounding = 2**-11 * np.abs(weight).max()  # |q * scale| and |min| below the row's max
        assert np.abs(got - weight).max() <= 2 * rounding, np.abs(got - weight).max()
        assert np.abs(got - weight).max() > 0  # the factors were rounded: the check can fail


def mxfp4_blocks(n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF MXFP4 blocks [n, row bytes] quantized by the gguf package from random weights
    whose blocks' ranges differ, their float weight [n, k] as gguf dequantizes them)."""
    rng = np.random.default_rng(seed)
    ranges = np.exp(rng.uniform(-6, 2, (n, k // 32, 1)))
    w = (rng.standard_normal((n, k // 32, 32)) * ranges).reshape(n, k)
    raw = gguf.quants.quantize(w.astype(np.float32), T.MXFP4)
    return raw, np.asarray(gguf.quants.dequantize(raw, T.MXFP4), dtype=np.float32)


def test_mxfp4_blocks_are_kept_as_stored():
    """GPT-OSS's experts: the format's blocks are GGUF's, byte for byte, and dequantize as the
    gguf package does, for every exponent (denormal scales 2^-128, 2^-127 and 2^127 too)."""
    raw, weight = mxfp4_blocks(6, 512)
    fmt, blocks = quant.from_gguf(raw, T.MXFP4, (6, 512))
    assert fmt is quant.MXFP4 and blocks.shape == (6, fmt.row_bytes(512))
    np.testing.assert_array_equal(blocks.numpy(), raw)
    np.testing.assert_array_equal(reference.dequantize(blocks, "mxfp4", 512).numpy(), weight)
    every, weight = every_exponent(seed=1)
    np.testing.assert_array_equal(
        reference.dequantize(torch.from_numpy(every), "mxfp4", 512).numpy(), weight
    )
    with pytest.raises(ValueError, match="bytes"):  # a row cut short
        quant.from_gguf(raw[:, :-17], T.MXFP4, (6, 512))


def every_exponent(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """16 rows of 512 weights in random MXFP4 blocks, each of the 256 exponents once, and
    their floats as gguf dequantizes them (2^127 times 8 or 12 overflows to infinity)."""
    raw = np.random.default_rng(seed).integers(0, 256, (16, 17 * 16), dtype=np.uint8)
    raw.reshape(-1, 17)[:, 0] = np.arange(256)
    with np.errstate(over="ignore"):
        return raw, np.asarray(gguf.quants.dequantize(raw, T.MXFP4), dtype=np.float32)


def test_mxfp4_rows_dequantize_as_gguf_does(path_lib):
    """Each path's expanded rows, every exponent included, exactly gguf's floats."""
    raw, weight = every_exponent(seed=2)
    fmt, blocks = quant.from_gguf(raw, T.MXFP4, (16, 512))
    packed = quant.interleave(blocks, fmt, path_lib.quant_group)
    ids = torch.tensor([15, 0, 3, 3, 9])
    got = path_lib.dequantize_rows(packed, "mxfp4", (16, 512), ids)
    np.testing.assert_array_equal(got.numpy(), weight[ids.numpy()])


@pytest.mark.parametrize("m", [1, 7], ids=["decode", "prefill"])
def test_mxfp4_matmul_equals_the_float_product(path_lib, m):
    """quant_matmul over gguf-quantized MXFP4 blocks against x @ gguf's dequantized weight:
    within the inputs' int8 rounding where the path rounds them, else to float error."""
    n, k = 37, 256
    raw, weight = mxfp4_blocks(n, k, seed=m)
    fmt, blocks = quant.from_gguf(raw, T.MXFP4, (n, k))
    x = torch.randn(m, k)
    got = path_lib.quant_matmul(x, quant.interleave(blocks, fmt, path_lib.quant_group), "mxfp4", n)
    exact = x.double() @ torch.from_numpy(weight).double().T
    w = torch.from_numpy(weight).reshape(n, -1, 32)
    step = x.reshape(m, -1, 32).abs().amax(-1) / 127
    bound = torch.einsum("mb,nb->mn", step.double() / 2, w.abs().sum(-1).double())
    if not path_lib.quant_rounds_inputs:
        bound = 0
    assert ((got.double() - exact).abs() <= bound + 1e-4 * (1 + exact.abs())).all()
    # The rounding moves the product: a kernel off by one level would move it far more.
    assert (got.double() - exact).abs().max() < 0.02 * exact.abs().max()


def test_a_type_without_a_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="Q2_K"):
        quant.from_gguf(np.zeros((1, 84), np.uint8), T.Q2_K, (1, 256))


def test_a_scale_beyond_float16_is_refused():
    raw, _ = gguf_blocks(T.Q4_K, 1, 256)
    raw.view(np.float16)[0, 0] = 60000.0  # d: times a 6-bit scale, past float16's max
    with pytest.raises(ValueError, match="float16"):
        quant.from_gguf(raw, T.Q4_K, (1, 256))


def test_only_q4_and_q8_pack_floats():
    with pytest.raises(ValueError, match="GGUF files only"):
        quant.quantize(torch.randn(4, 32), quant.Q5)
