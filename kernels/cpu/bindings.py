"""The CPU kernels of kernels/cpu*.cpp: built once with the system C++ compiler, called through
ctypes. Their twins in kernels/reference/attention.py define what they compute.

`load()` builds the library into ~/.cache/braid/kernels (keyed by the source, the compiler
and this CPU, since it is compiled for the CPU it runs on) and returns a `CpuKernels`, or None
when there is no compiler or the build fails: callers then use the twins.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import numpy as np
import torch

from braid.kernels import native as _native
from braid.kernels.cpu.quant import interleaved_rows

log = logging.getLogger(__name__)

# Compiled together into one library; the header is listed for the cache key.
SOURCES = [
    Path(__file__).with_name(n)
    for n in (
        "cpu.cpp", "cpu_attention.cpp", "cpu_quant.cpp", "cpu_decoder.cpp", "cpu_lora.cpp",
        "cpu_common.h",
    )
]  # fmt: skip
_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]
_FLAGS += ["-shared", "-fPIC", "-std=c++17"]
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_ARGTYPES = {
    "add_rms_norm": [_P, _P, _P, _P, _I64, _I64, ctypes.c_float, _INT],
    "silu_mul": [_P, _P, _I64, _I64, _INT],
    "rope_store_kv": [_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _INT],
    # ..., scale, softcap (0: none), sinks (null: none), threads
    "decode_attention": [_P, _I64, _P, _P, _P, _P, _P, _P, _P]
    + [_I64, _I64, _I64, _I64, ctypes.c_float, ctypes.c_float, _P, _INT],
    "argmax_rows": [_P, _I64, _I64, _I64, _P, _INT],
    # rope_store_kv's arguments, then decode_attention's from out to sinks
    "rope_store_attend": [_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64]
    + [_P, _P, _P, _P, _P, _I64, ctypes.c_float, ctypes.c_float, _P, _INT],
}
# Every entry point comes in one variant per dtype, named with its suffix...
_SIGNATURES = {
    f"{name}_{suffix}": (argtypes, None)
    for name, argtypes in _ARGTYPES.items()
    for suffix in _SUFFIX.values()
}
# ...but the quantized linears (float32 activations), which take a format id: the index in
# QUANT_FORMATS (kernels/cpu/cpu_quant.cpp's FormatId).
QUANT_FORMATS = ("q4", "q5", "q8", "iq4", "q6", "mxfp4")
_SIGNATURES["quant_matmul"] = ([_I64, _P, _I64, _I64, _P, _I64, _P, _I64, _INT], None)
_SIGNATURES["dequantize_rows"] = ([_I64, _P, _I64, _P, _I64, _P, _INT], None)
_SIGNATURES["quant_rounds_inputs"] = ([], _I64)
_SIGNATURES["quant_group_rows"] = ([], _I64)
_SIGNATURES["quant_decode_layers"] = ([_P, _I64, _P, _P, _P, _P, _INT], None)
# LoRA updates take float32 activations only (a bfloat16 model's run in torch).
_SIGNATURES["lora_add_f32"] = ([_P, _I64, _P, _I64, _I64, _I64, _I64, _P, _P, _INT], None)


# The structures quant_decode_layers takes (kernels/cpu/cpu_decoder.cpp), field for field.
class QuantPart(ctypes.Structure):
    _fields_ = [("blocks", _P), ("format", _I64), ("rows", _I64)]


MAX_QUANT_PARTS = 3


class QuantWeight(ctypes.Structure):
    """A linear's output rows in up to MAX_QUANT_PARTS parts, each in its own format."""

    _fields_ = [("parts", QuantPart * MAX_QUANT_PARTS), ("num_parts", _I64)]


class QuantDecoderLayer(ctypes.Structure):
    _fields_ = [
        *((name, _P) for name in ("input_norm", "post_attention_norm", "q_norm", "k_norm")),
        *((name, QuantWeight) for name in ("qkv", "o", "gate_up", "down")),
        ("k_cache", _P),
        ("v_cache", _P),
    ]


class QuantDecoderShape(ctypes.Structure):
    _fields_ = [
        *((name, _I64) for name in ("hidden", "heads", "kv_heads", "head_dim", "intermediate")),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
    ]


class QuantDecoderBatch(ctypes.Structure):
    _fields_ = [
        ("tokens", _I64),
        *((name, _P) for name in ("positions", "slots", "rows", "kv_starts", "kv_lens")),
        ("kv_indices", _P),
        ("num_rows", _I64),
        ("cos", _P),
        ("sin", _P),
        # LoRA (null pointers: none): each token's adapter index, or -1, and the packed
        # pairs (lora_weights) of every (layer, linear of LORA_LINEARS, adapter), layers
        # from the first.
        ("lora_adapters", _P),
        ("lora_weights", _P),
        ("lora_count", _I64),
        ("lora_layers", _I64),
        # Draft heads' hidden states (null: none): the layers whose input stream is copied
        # out, how many, and where to ([tokens, num_captures, hidden] float32).
        ("capture_layers", _P),
        ("num_captures", _I64),
        ("captured", _P),
    ]


# The linears quant_decode_layers applies LoRA pairs to, in the order of its table.
LORA_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def lora_spans(b: torch.Tensor) -> torch.Tensor:
    """int64 [R, 2]: for each rank column of B [out, R], the rows [first, end) outside which
    it is zero ((0, 0) where all of it is): lora_add skips the rest. In numpy, on one thread:
    a few passes over B, once per adapter load, where torch's forked ops cost more."""
    nonzero = b.T.numpy() != 0  # [R, out], contiguous for a column-major B
    first = nonzero.argmax(1)  # the first maximum: the first nonzero row, or 0
    end = np.where(nonzero.any(1), b.shape[0] - nonzero[:, ::-1].argmax(1), 0)
    return torch.from_numpy(np.stack([first, end], 1).astype(np.int64))


def lora_weights(a: torch.Tensor, b: torch.Tensor, spans: torch.Tensor) -> tuple[int, ...]:
    """One adapter's pair for one linear as lora_add reads it (kernels/cpu/cpu_common.h's
    LoraWeights): A's address, B's address, the rank, the address of B's `lora_spans`. A
    [R, in] row-major and B [out, R] column-major (b.T contiguous: its expand runs along rank
    columns), float32 CPU."""
    rank = a.shape[0]
    if not (a.dtype == b.dtype == torch.float32 and a.is_cpu and b.is_cpu):
        raise ValueError(f"lora_add: float32 CPU pairs, got {a.dtype} and {b.dtype}")
    if not (a.is_contiguous() and b.shape[1] == rank and b.T.is_contiguous()):
        raise ValueError("lora_add: A [R, in] must be contiguous and B [out, R] column-major")
    _check_index([spans])
    if spans.shape != (rank, 2):
        raise ValueError(f"lora_add: spans [{rank}, 2], not {tuple(spans.shape)}")
    return a.data_ptr(), b.data_ptr(), rank, spans.data_ptr()


_lock = threading.Lock()
_loaded: dict[tuple[Path | None, tuple[str, ...]], CpuKernels | None] = {}


def load(build_dir: Path | None = None, extra_flags: tuple[str, ...] = ()) -> CpuKernels | None:
    """The kernels, built on first use (a few seconds, once per machine); None when they
    cannot be built here (the reason is logged once). `extra_flags` go to the compiler after
    the usual ones: tests build the paths of other CPUs with them (e.g. -mno-avx512f)."""
    key = (build_dir, extra_flags)
    if key in _loaded:  # the sampler asks every step: no lock, no home directory lookup
        return _loaded[key]
    with _lock:
        if key not in _loaded:
            target = build_dir or Path.home() / ".cache" / "braid" / "kernels"
            try:
                path = _native.build("cpu", SOURCES, [*_FLAGS, *extra_flags], target)
                kernels = CpuKernels(_native.load(path, _SIGNATURES))
            except OSError as e:
                log.warning("CPU kernels unavailable (%s): the CPU path uses torch ops", e)
                kernels = None
            _loaded[key] = kernels
        return _loaded[key]


class CpuKernels:
    """Typed entry points over the library, with the signatures of their twins in
    kernels.reference (decode_attention excepted: it writes the rows of a hybrid batch), and
    argmax, whose twin is torch.argmax."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {
            (name, suffix): getattr(lib, f"{name}_{suffix}")
            for name in _ARGTYPES
            for suffix in _SUFFIX.values()
        }
        self._quant_matmul, self._dequantize_rows = lib.quant_matmul, lib.dequantize_rows
        # Whether quant_matmul rounds its inputs to int8 blocks (with AVX2 and up), and the
        # rows the kernels read interleaved together (kernels/cpu/quant.py's `interleave`).
        self.quant_rounds_inputs = bool(lib.quant_rounds_inputs())
        self.quant_group = lib.quant_group_rows()
        self._decode_layers = lib.quant_decode_layers
        self._lora_add = lib.lora_add_f32

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in _SUFFIX

    def _fn(self, name: str, dtype: torch.dtype):
        return self._fns[name, _SUFFIX[dtype]]

    def add_rms_norm(
        self,
        x: torch.Tensor | None,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:
        """residual += x (in place; skipped when x is None), then weight * rmsnorm(residual).
        x, residual: [rows, dim]; weight: [dim]."""
        _check(residual.dtype, data=[residual, weight, x])
        rows, dim = residual.shape
        out = torch.empty_like(residual)
        self._fn("add_rms_norm", residual.dtype)(
            None if x is None else x.data_ptr(),
            residual.data_ptr(),
            weight.data_ptr(),
            out.data_ptr(),
            rows,
            dim,
            eps,
            _threads(),
        )
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up = [gate | up], [rows, 2 * dim] -> [rows, dim]."""
        _check(gate_up.dtype, data=[gate_up])
        rows, dim = gate_up.shape[0], gate_up.shape[1] // 2
        out = gate_up.new_empty(rows, dim)
        self._fn("silu_mul", gate_up.dtype)(
            gate_up.data_ptr(), out.data_ptr(), rows, dim, _threads()
        )
        return out

    def rope_store_kv(
        self,
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
        """Rotate the q and k heads of qkv [T, (H + 2 Hkv) * D] in place at `positions` (cos/sin
        tables [P, D / 2], float32), then write k and v into `slots` of the pool [S, Hkv, D]."""
        args = _rope_args(
            qkv, num_heads, num_kv_heads, positions, cos, sin, k_cache, v_cache, slots
        )
        self._fn("rope_store_kv", qkv.dtype)(*args, _threads())

    def rope_store_attend(
        self,
        qkv: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        out: torch.Tensor,
        rows: torch.Tensor,
        kv_starts: torch.Tensor,
        kv_lens: torch.Tensor,
        kv_indices: torch.Tensor,
        scale: float,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """rope_store_kv, then decode_attention of the q heads of qkv for `rows`, in one call
        and one parallel region (every token is stored before any row attends)."""
        args = _rope_args(
            qkv, num_heads, num_kv_heads, positions, cos, sin, k_cache, v_cache, slots
        )
        _check(qkv.dtype, data=[out])
        rows_args = _rows_args(rows, kv_starts, kv_lens, kv_indices)
        self._fn("rope_store_attend", qkv.dtype)(
            *args, out.data_ptr(), *rows_args, scale, *_options(softcap, sinks, num_heads),
            _threads(),
        )  # fmt: skip

    def decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
        rows: torch.Tensor,
        kv_starts: torch.Tensor,
        kv_lens: torch.Tensor,
        kv_indices: torch.Tensor,
        scale: float,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Attention of one query token per row: q[rows[i]] ([T, H, D]; tokens may be strided,
        heads packed) over the slots kv_indices[kv_starts[i]:kv_starts[i] + kv_lens[i]] of the
        pool [S, Hkv, D], written into out[rows[i]] ([T, H, D], contiguous); other rows of out
        are left alone. `softcap`: scores become softcap * tanh(score / softcap); `sinks`
        (float32 [H]): each head's logit joins the softmax's denominator with no value. As
        kernels.reference.decode_attention on those rows."""
        _check(q.dtype, data=[k_cache, v_cache, out])
        tokens, num_heads, head_dim = q.shape
        if q.device.type != "cpu" or q.stride(2) != 1 or q.stride(1) != head_dim:
            raise ValueError("decode_attention: q's heads must be packed [H, D] per token")
        self._fn("decode_attention", q.dtype)(
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            out.data_ptr(),
            *_rows_args(rows, kv_starts, kv_lens, kv_indices),
            num_heads,
            k_cache.shape[1],
            head_dim,
            scale,
            *_options(softcap, sinks, num_heads),
            _threads(),
        )

    def quant_matmul(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        fmt: str,
        out_features: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [M, K] (float32) @ the quantized weight [N = out_features, K] transposed ->
        float32 [M, N], into `out` if given (its rows may be strided: a column slice of a wider
        output). `packed`: the weight's `fmt` blocks as kernels/cpu/quant.py's `interleave` lays
        them out for `quant_group`. As kernels.reference.quant_matmul_int8 where
        `quant_rounds_inputs`, else as kernels.reference.quant_matmul."""
        _check(torch.float32, data=[x])
        self._check_packed(packed, out_features)
        if out is None:
            out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
        elif not (
            out.dtype == torch.float32 and out.is_cpu and out.shape == (x.shape[0], out_features)
            and out.stride(1) == 1
        ):  # fmt: skip
            raise ValueError(f"quant_matmul: out must be float32 [{x.shape[0]}, {out_features}]")
        self._quant_matmul(
            QUANT_FORMATS.index(fmt), x.data_ptr(), x.shape[0], x.shape[1], packed.data_ptr(),
            out_features, out.data_ptr(), out.stride(0), _threads(),
        )  # fmt: skip
        return out

    def quant_decode_layers(
        self,
        layers: ctypes.Array,
        num_layers: int,
        shape: QuantDecoderShape,
        residual: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        rows: torch.Tensor,
        kv_starts: torch.Tensor,
        kv_lens: torch.Tensor,
        kv_indices: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: tuple[torch.Tensor, torch.Tensor] | None = None,
        capture: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The first `num_layers` decoder layers of a quantized float32 model over decode
        rows in one call (kernels/cpu/cpu_decoder.cpp): `residual` [T, hidden] is updated in
        place; returns the last layer's MLP output [T, hidden]. The other arguments are
        rope_store_attend's; the layers' pointers are the caller's to keep valid
        (runtime/models/layers/quant_decoder.py builds them). `lora`: each token's adapter (int64
        [T], -1 for none) and the pairs int64 [L, len(LORA_LINEARS), N, 4] of lora_add, for
        the first L layers (later ones get none), added after each of those linears.
        `capture`: (layers int64 [C], out float32 [T, C, hidden]): the residual stream
        entering each of those layers (below num_layers; -1: none) is copied into out[:, c]."""
        _check(torch.float32, data=[residual, cos, sin])
        index = [positions, slots, rows, kv_starts, kv_lens, kv_indices]
        _check_index(index)
        ptrs = [t.data_ptr() for t in index]
        batch = QuantDecoderBatch(
            residual.shape[0], *ptrs, rows.numel(), cos.data_ptr(), sin.data_ptr()
        )
        if lora is not None:
            adapters, weights = lora
            _check_lora(residual.shape[0], adapters, weights)
            if weights.dim() != 4 or weights.shape[1] != len(LORA_LINEARS):
                raise ValueError(f"quant_decode_layers: LoRA pairs of shape {weights.shape}")
            batch.lora_adapters, batch.lora_weights = adapters.data_ptr(), weights.data_ptr()
            batch.lora_count, batch.lora_layers = weights.shape[2], weights.shape[0]
        if capture is not None:
            which, captured = capture
            _check_index([which])
            if (
                captured.dtype != torch.float32
                or not captured.is_contiguous()
                or (captured.shape != (residual.shape[0], which.numel(), residual.shape[1]))
            ):
                raise ValueError(
                    f"quant_decode_layers: capture out {tuple(captured.shape)} "
                    f"{captured.dtype} for {which.numel()} layers of {tuple(residual.shape)}"
                )
            if which.numel() and not -1 <= int(which.min()) <= int(which.max()) < num_layers:
                raise ValueError(f"quant_decode_layers: capture layers {which.tolist()}")
            batch.capture_layers, batch.captured = which.data_ptr(), captured.data_ptr()
            batch.num_captures = which.numel()
        out = torch.empty_like(residual)
        self._decode_layers(
            ctypes.addressof(layers), num_layers, ctypes.addressof(shape),
            ctypes.addressof(batch), residual.data_ptr(), out.data_ptr(), _threads(),
        )  # fmt: skip
        return out

    def lora_add(
        self, y: torch.Tensor, x: torch.Tensor, adapters: torch.Tensor, weights: torch.Tensor
    ) -> None:
        """y [T, out] += B_i @ (A_i @ x[t]) in place for each row t of x [T, in] whose adapter
        i = adapters[t] (int64 [T]) is not -1; rows may be strided. `weights` int64 [N, 4]:
        adapter i's pair for this linear packed by `lora_weights`, or zeros where it leaves
        the linear alone; its tensors, and indices below N, are the caller's to keep. As
        kernels.reference.lora_rows."""
        for t in (x, y):
            if not (t.dtype == torch.float32 and t.is_cpu and t.dim() == 2 and t.stride(1) == 1):
                raise ValueError("lora_add: x and y must be float32 CPU [T, n] with unit columns")
        _check_lora(x.shape[0], adapters, weights)
        if y.shape[0] != x.shape[0] or weights.dim() != 2:
            raise ValueError(f"lora_add: x {x.shape}, y {y.shape}, pairs {weights.shape}")
        self._lora_add(
            x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), x.shape[0], x.shape[1],
            y.shape[1], adapters.data_ptr(), weights.data_ptr(), _threads(),
        )  # fmt: skip

    def dequantize_rows(
        self, packed: torch.Tensor, fmt: str, shape: tuple[int, int], ids: torch.Tensor
    ) -> torch.Tensor:
        """Rows `ids` of the quantized weight of `shape` (N, K) as float32 [len(ids), K] (a
        quantized embedding table's lookup); `packed` as quant_matmul's. As
        kernels.reference.dequantize's rows."""
        n, k = shape
        self._check_packed(packed, n)
        _check_index([ids])
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < n:
            raise ValueError(f"dequantize_rows: ids outside [0, {n})")
        out = torch.empty(ids.numel(), k, dtype=torch.float32)
        self._dequantize_rows(
            QUANT_FORMATS.index(fmt), packed.data_ptr(), k, ids.data_ptr(), ids.numel(),
            out.data_ptr(), _threads(),
        )  # fmt: skip
        return out

    def _check_packed(self, packed: torch.Tensor, rows: int) -> None:
        if not (packed.dtype == torch.uint8 and packed.is_cpu and packed.is_contiguous()):
            raise _refused(packed, torch.uint8)
        group = self.quant_group
        if packed.shape[0] != interleaved_rows(rows, group):
            raise ValueError(
                f"{rows} rows come interleaved in {interleaved_rows(rows, group) // group} "
                f"groups of {group}, not {packed.shape[0]} rows (kernels/cpu/quant.py's interleave)"
            )

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """x.argmax(dim=-1) of a [rows, cols] CPU tensor whose rows may be strided (a slice of
        wider logits): the first index on ties, or that of the first NaN."""
        if x.dim() != 2 or x.device.type != "cpu" or x.stride(1) != 1:
            raise ValueError("argmax: x must be a [rows, cols] CPU tensor with unit column stride")
        _check(x.dtype, data=[])
        out = torch.empty(x.shape[0], dtype=torch.int64)
        self._fn("argmax_rows", x.dtype)(
            x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr(), _threads()
        )
        return out


def _rope_args(qkv, num_heads, num_kv_heads, positions, cos, sin, k_cache, v_cache, slots):
    """rope_store_kv's arguments as the C entry points take them, checked."""
    _check(qkv.dtype, data=[qkv, k_cache, v_cache], index=[positions, slots])
    _check(torch.float32, data=[cos, sin])
    ptrs = [t.data_ptr() for t in (qkv, positions, cos, sin, k_cache, v_cache, slots)]
    return (*ptrs, qkv.shape[0], num_heads, num_kv_heads, k_cache.shape[-1])


def _options(softcap: float | None, sinks: torch.Tensor | None, num_heads: int) -> tuple:
    """The attention options as the C entry points take them (0 and null: none), checked."""
    if softcap is not None and not softcap > 0:
        raise ValueError(f"attention softcap must be positive, got {softcap}")
    if sinks is not None:
        _check(torch.float32, data=[sinks])
        if sinks.shape != (num_heads,):
            raise ValueError(f"attention sinks: one a head ({num_heads}), not {tuple(sinks.shape)}")
    return (softcap or 0.0, None if sinks is None else sinks.data_ptr())


def _rows_args(rows, kv_starts, kv_lens, kv_indices):
    """The decode rows' arguments as the C entry points take them, checked."""
    _check_index([rows, kv_starts, kv_lens, kv_indices])
    ptrs = [t.data_ptr() for t in (rows, kv_starts, kv_lens, kv_indices)]
    return (*ptrs, rows.numel())


def _check_lora(tokens: int, adapters: torch.Tensor, weights: torch.Tensor) -> None:
    _check_index([adapters, weights])
    if adapters.shape != (tokens,) or weights.shape[-1] != 4:
        raise ValueError(
            f"LoRA: an adapter index a token ({tokens}), not {tuple(adapters.shape)}, and "
            f"pairs [..., N, 4], not {tuple(weights.shape)}"
        )


def _threads() -> int:
    return torch.get_num_threads()


def _check(
    dtype: torch.dtype, data: list[torch.Tensor | None], index: list[torch.Tensor] = ()
) -> None:
    """The library reads raw pointers: every tensor must be a contiguous CPU tensor of the
    type the entry point was chosen for (data) or int64 (indices). Called several times per
    layer, hence the plain loops over cheap attributes."""
    if dtype not in _SUFFIX:
        raise ValueError(f"CPU kernels take float32 or bfloat16 tensors, got {dtype}")
    for t in data:
        if t is not None and not (t.dtype == dtype and t.is_cpu and t.is_contiguous()):
            raise _refused(t, dtype)
    _check_index(index)


def _check_index(index: list[torch.Tensor]) -> None:
    for t in index:
        if not (t.dtype == torch.int64 and t.is_cpu and t.is_contiguous()):
            raise _refused(t, torch.int64)


def _refused(t: torch.Tensor, want: torch.dtype) -> ValueError:
    return ValueError(
        f"CPU kernels take contiguous CPU {want} tensors here, got a "
        f"{'contiguous ' if t.is_contiguous() else ''}{t.device} {t.dtype} tensor"
    )
