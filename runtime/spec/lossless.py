"""Whether verification rows come out bit for bit as decode rows on this model and machine:
what `spec_method="auto"` turns speculation on for.

Speculation keeps greedy output identical to plain decoding only if a token verified among
the 1 + k rows of a draft tree gets the logits it would get as a decode row. The CPU
kernels make it so by construction: the quantized linears round each input row to int8 on
its own and sum its integer blocks in one order whatever the number of rows (AVX2 and up),
and attention reads each row's slots alone (runtime/attention/cpu_kernels.py). Float
linears go through torch's BLAS, which picks a kernel by the number of rows (on one AVX-512
machine MKL's float32 GEMV and GEMM differ in the last bits; oneDNN's bfloat16 did not):
that is measured here, on the model's own shapes, rather than assumed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from braid.runtime.attention.cpu_kernels import CpuKernelAttention
from braid.runtime.models.layers.batch_invariant import BatchInvariantLinear
from braid.runtime.models.layers.quantized import QuantLinear
from braid.runtime.models.moe import Experts

PROBE_ROWS = 9  # a decode row against a verification step of 1 + 8 rows


def unlike_decode_rows(model: nn.Module) -> str | None:
    """Why verification rows may differ from decode rows on `model` here, or None when they
    cannot."""
    if not isinstance(model.ops.attention, CpuKernelAttention):
        return f"attention on the {model.ops.name} path is batched by shape, not row by row"
    if any(isinstance(m, Experts) for m in model.modules()):  # (quantized ones: QuantExperts)
        return "float experts run as GEMMs whose kernel depends on the tokens routed to them"
    seen: set[tuple] = set()
    for module in model.modules():
        if isinstance(module, QuantLinear):
            if not (module.kernels is not None and module.kernels.quant_rounds_inputs):
                return "this CPU's quantized kernels do not round inputs per row (no AVX2)"
        elif isinstance(module, nn.Linear) and not isinstance(module, BatchInvariantLinear):
            shape = (*module.weight.shape, module.weight.dtype)
            if shape not in seen:
                seen.add(shape)
                if not _rows_alone_equal_rows_together(module.weight):
                    out, inp, dtype = shape
                    return (
                        f"{str(dtype).removeprefix('torch.')} linears [{out}, {inp}] round "
                        "differently by batch size here (deterministic=True fixes that)"
                    )
    return None


def _rows_alone_equal_rows_together(weight: torch.Tensor) -> bool:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, weight.shape[1], generator=g).to(weight.dtype)
    with torch.inference_mode():
        together = F.linear(x, weight)
        return all(torch.equal(F.linear(x[i : i + 1], weight)[0], together[i]) for i in (0, 4))
