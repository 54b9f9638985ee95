"""What `quantization="auto"` means: a model that came from a GGUF file (the embedded default
model, or a .gguf a user passes) runs on the file's own blocks in the CPU kernels, as
llama.cpp runs it; anything else runs in its floats.

The blocks are the fast path on a CPU (a step reads a few bits a weight instead of 32) and
the memory a llama.cpp user expects, so they are the default wherever they can run; `auto`
falls back to floats, saying why, where they cannot: on CUDA, in deterministic mode on a CPU
whose kernels do not round inputs per row (no AVX2: long chunks there take torch's GEMM, which
is not batch-invariant), with tensor parallelism (the blocks are not split
over ranks), without the C++ kernels, or for a file holding a block type with no kernel here.
"""

from __future__ import annotations

from pathlib import Path

from braid.runtime.config import EngineConfig
from braid.runtime.loading.gguf import files as gguf_file


def resolve_quantization(config: EngineConfig, model_dir: Path) -> tuple[str, str]:
    """(the quantization the engine runs with, why it was chosen)."""
    if config.quantization != "auto":
        return config.quantization, "asked for"
    source = gguf_file.source(model_dir)
    if source is None:
        return "none", "auto: not a GGUF model, its weights run as stored"
    if config.torch_device.type != "cpu":
        return "none", "auto: GGUF blocks run in the CPU kernels only"
    if config.tp > 1:
        return "none", "auto: GGUF blocks are not split over tensor-parallel ranks"
    kernels = _cpu_kernels() if config.cpu_kernels else None
    if kernels is None:
        return "none", "auto: the C++ kernels that read GGUF blocks are not available"
    if config.deterministic and not kernels.quant_rounds_inputs:
        return "none", "auto: deterministic mode, and these kernels are not batch-invariant here"
    types = gguf_file.block_types(source)
    if missing := gguf_file.without_kernel(types):
        return "none", f"auto: {source.name} holds {', '.join(missing)}, which no kernel reads"
    return "gguf", f"auto: {source.name}'s own blocks ({', '.join(types)})"


def _cpu_kernels():
    from braid.kernels import cpu

    return cpu.load()
