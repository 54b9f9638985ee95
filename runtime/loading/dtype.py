"""What `dtype="auto"` means on this machine: bfloat16 on CUDA; on a CPU, whichever of
float32 and bfloat16 runs the model's linear layers faster here.

A rule on CPU flags is not enough: a Xeon with AVX512-BF16 and no AMX ran the default model's
batch-64 linears slower in bfloat16 than in float32, while an EPYC with the same flag ran
bfloat16 several times faster. So `auto` times one linear of the model's shape in each dtype
at the batch the engine decodes at, once per CPU, model shape and torch version (cached in
~/.cache/braid/dtype.json), and logs the choice and why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from braid.kernels.native import cpu_signature
from braid.runtime.config import DTYPES, EngineConfig
from braid.runtime.models.config.model_config import ModelConfig

log = logging.getLogger(__name__)

# Rows timed: a decode step of a busy server, where the linears dominate the step.
BATCH = 64
_REPEATS = 10

# (dtype, in_features, out_features) -> seconds for one BATCH-row forward.
Timer = Callable[[torch.dtype, int, int], float]


def resolve_dtype(
    config: EngineConfig, model: ModelConfig, timer: Timer | None = None
) -> tuple[torch.dtype, str]:
    """(the dtype the engine runs in, why it was chosen). `config.quantization` must be
    resolved already (runtime/loading/quantization.py): it decides the activations' dtype."""
    if config.quantization == "auto":
        raise ValueError("resolve_dtype: resolve quantization='auto' first")
    if config.dtype != "auto":
        return DTYPES[config.dtype], "asked for"
    if config.torch_device.type == "cuda":
        return torch.bfloat16, "auto on CUDA"
    if config.quantization != "none":  # the kernels compute in float32 (kernels/cpu/cpu_quant.cpp)
        return torch.float32, "auto: quantized linears take float32 activations"
    if not cpu_has_bf16_matmuls():
        return torch.float32, "auto: this CPU has no bfloat16 matmuls"
    shape = (model.hidden_size, model.intermediate_size)
    seconds = _cached_timings(shape, timer or _time_linear)
    fastest = min(seconds, key=seconds.get)
    why = ", ".join(f"{name} {s * 1e3:.2f} ms" for name, s in seconds.items())
    return DTYPES[fastest], f"auto: {BATCH} rows x {shape[0]}x{shape[1]} linear on this CPU: {why}"


def cpu_has_bf16_matmuls() -> bool:
    """Whether oneDNN runs bfloat16 matmuls here (natively or emulated on AVX-512)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _cached_timings(shape: tuple[int, int], timer: Timer) -> dict[str, float]:
    """Seconds per forward in each dtype: measured, or from the cache of earlier measures
    on this CPU (a custom timer, in tests, is never cached)."""
    path = Path(os.environ.get("BRAID_CACHE", Path.home() / ".cache" / "braid")) / "dtype.json"
    key = hashlib.sha256(
        "\0".join([cpu_signature(), torch.__version__, str(shape)]).encode()
    ).hexdigest()[:16]
    cacheable = timer is _time_linear
    cache = _read(path) if cacheable else {}
    if key not in cache:
        cache[key] = {name: timer(DTYPES[name], *shape) for name in ("float32", "bfloat16")}
        if cacheable:
            _write(path, cache)
    return cache[key]


def _time_linear(dtype: torch.dtype, in_features: int, out_features: int) -> float:
    """Best of a few timed forwards of a BATCH-row linear (after a warm-up)."""
    linear = torch.nn.Linear(in_features, out_features, bias=False, dtype=dtype)
    x = torch.randn(BATCH, in_features, dtype=dtype)
    best = float("inf")
    with torch.no_grad():
        linear(x)
        for _ in range(_REPEATS):
            start = time.perf_counter()
            linear(x)
            best = min(best, time.perf_counter() - start)
    return best


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, cache: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, path)  # concurrent engines never read half a file
    except OSError as e:
        log.warning("cannot cache the dtype timings in %s: %s", path, e)
