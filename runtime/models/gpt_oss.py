"""GPT-OSS (transformers' GptOssForCausalLM), our own forward.

The Llama-shaped decoder (modeling_gpt_oss.py is the reference) with:
- attention with biases on q, k, v and o, and a learned sink logit per head that joins the
  softmax's denominator without a value (the attention backends' `sinks`), on alternating
  sliding-window and full layers, with YaRN rope;
- every MLP a mixture of experts: the router (a linear with bias) keeps each token's top k
  logits and softmaxes over those k; each expert is a SwiGLU with biases whose gate is clamped
  above at `limit` and up to +-limit, out = (up + 1) * gate * sigmoid(alpha * gate); the
  experts run grouped by expert over the batch (moe.run_grouped).
The experts are held stacked per layer: gate_up_proj [E, 2 I, hidden] (gate's I rows, then
up's: transformers' checkpoint interleaves them, gate in the even columns, and stores the
matrices transposed; a GGUF file stores gate and up apart), gate_up_proj_bias [E, 2 I] in the
same order, down_proj [E, hidden, I] and down_proj_bias [E, hidden]; or, from a GGUF file
with quantized experts, as their blocks (GptOssQuantExperts) beside the float biases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.models.config.model_config import ModelConfig
from braid.runtime.models.config.moe import MoeConfig
from braid.runtime.models.layers.batch_invariant import BatchInvariantLinear
from braid.runtime.models.layers.ops import LayerOps
from braid.runtime.models.llama import Attention, LlamaForCausalLM
from braid.runtime.models.moe import Experts, QuantExperts, run_grouped

# An MXFP4 checkpoint's 4-bit values (E2M1): bit 3 the sign, then the magnitude's code.
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """(up + 1) * gate * sigmoid(alpha * gate) for gate_up = [gate | up] (..., 2 I), with gate
    clamped above at `limit` and up to [-limit, limit]."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


class GptOssAttention(Attention):
    """Llama's attention (biases on q, k, v and o) with each head's sink logit."""

    def __init__(self, config: ModelConfig, layer: int, linear: type[nn.Linear]) -> None:
        super().__init__(config, layer, linear)
        self.sinks = nn.Parameter(torch.empty(config.num_heads))


def _add_biases_and_limits(experts: nn.Module, moe: MoeConfig, hidden: int) -> None:
    """What GPT-OSS's experts add to the SwiGLU experts: a bias per projection (float, also
    beside quantized blocks), and the clamped SwiGLU's constants."""
    experts.gate_up_proj_bias = nn.Parameter(
        torch.empty(moe.num_experts, 2 * moe.intermediate_size)
    )
    experts.down_proj_bias = nn.Parameter(torch.empty(moe.num_experts, hidden))
    experts.alpha, experts.limit = moe.swiglu_alpha, moe.swiglu_limit


class GptOssExperts(Experts):
    """The experts' clamped SwiGLU MLPs with their biases, stacked."""

    def __init__(self, moe: MoeConfig, hidden: int) -> None:
        super().__init__(moe, hidden)
        _add_biases_and_limits(self, moe, hidden)

    def run(self, expert: int, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        """Expert `expert`'s MLP on x (n, hidden) -> (n, hidden)."""
        gate_up = F.linear(x, self.gate_up_proj[expert], self.gate_up_proj_bias[expert])
        h = clamped_swiglu(gate_up, self.alpha, self.limit)  # (n, I)
        return F.linear(h, self.down_proj[expert], self.down_proj_bias[expert])

    def quantized(self, gate_up_fmt: str, down_fmt: str) -> GptOssQuantExperts:
        return GptOssQuantExperts(self.moe, self.hidden, gate_up_fmt, down_fmt)


class GptOssQuantExperts(QuantExperts):
    """GptOssExperts with the matrices' GGUF blocks kept (QuantExperts), the biases floats."""

    def __init__(self, moe: MoeConfig, hidden: int, gate_up_fmt: str, down_fmt: str) -> None:
        super().__init__(moe, hidden, gate_up_fmt, down_fmt)
        _add_biases_and_limits(self, moe, hidden)

    def run(self, expert: int, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        """As GptOssExperts.run, through the quantized matmul kernels."""
        gate_up = self.gate_up[expert](x) + self.gate_up_proj_bias[expert]
        h = clamped_swiglu(gate_up, self.alpha, self.limit)  # (n, I)
        return self.down[expert](h) + self.down_proj_bias[expert]


class GptOssMoe(nn.Module):
    def __init__(self, config: ModelConfig, linear: type[nn.Linear]) -> None:
        super().__init__()
        moe = config.moe
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        # Batch-invariant for free (a few dozen rows): runtime/spec/lossless.py.
        self.router = BatchInvariantLinear(config.hidden_size, moe.num_experts, bias=True)
        self.experts = GptOssExperts(moe, config.hidden_size)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, ops: LayerOps) -> torch.Tensor:
        """x (T, hidden) -> the experts' weighted sum (T, hidden)."""
        logits, experts = torch.topk(self.router(x), self.top_k, dim=-1)  # (T, k)
        weights = torch.softmax(logits, dim=-1)  # in x's dtype, as transformers
        return run_grouped(x, experts, weights, self.num_experts, self.experts.run, ops)


class GptOssForCausalLM(LlamaForCausalLM):
    """The Llama decoder with GptOssAttention and GptOssMoe in every layer. The fused decode
    kernel (quant_decoder.py) is the dense shape's: the layers run one by one."""

    def __init__(self, config: ModelConfig, linear: type[nn.Linear] = nn.Linear) -> None:
        super().__init__(config, linear)
        for i, layer in enumerate(self.layers):
            layer.self_attn = GptOssAttention(config, i, linear)
            layer.mlp = GptOssMoe(config, linear)

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """transformers' checkpoint names and layouts: the experts' matrices transposed
        (gate_up_proj [E, hidden, 2 I], gate and up interleaved; down_proj [E, I, hidden]),
        or as OpenAI's checkpoints store them, MXFP4 blocks and scales
        (gate_up_proj_blocks [E, 2 I, hidden / 32, 16] and gate_up_proj_scales), dequantized
        here; or a GGUF file's, gate, up and down apart with their biases
        (mlp.experts.gate_proj.weight [E, I, hidden], .bias [E, I]), the weights absent where
        GptOssQuantExperts hold their blocks. The experts are converted and copied in one
        layer at a time (a layer's float32 copy at most beside the model)."""
        weights = dict(weights)
        own = self.state_dict()
        for i in range(self.config.num_layers):
            prefix = f"layers.{i}.mlp.experts."
            for name, tensor in _experts_in_our_layout(weights, "model." + prefix).items():
                target = own[prefix + name]
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"weight model.{prefix}{name}: checkpoint has shape "
                        f"{tuple(tensor.shape)} in our layout, the config implies "
                        f"{tuple(target.shape)}"
                    )
                target.copy_(tensor)
                weights["model." + prefix + name] = target  # loaded: copied onto itself
        super().load_hf_weights(weights)


def _experts_in_our_layout(weights: dict[str, torch.Tensor], prefix: str) -> dict:
    """One layer's experts (names under `prefix`, popped from `weights`) in GptOssExperts'
    layout: transposed to [E, out, in], gate's rows before up's; MXFP4 dequantized."""
    if prefix + "gate_proj.bias" in weights:  # a GGUF file's
        return _gguf_experts(weights, prefix)
    for name in ("gate_up_proj", "down_proj"):
        blocks, scales = prefix + name + "_blocks", prefix + name + "_scales"
        if blocks in weights and scales in weights:  # [E, out, in]: transposed already
            weights[prefix + name] = dequantize_mxfp4(weights.pop(blocks), weights.pop(scales))
        elif prefix + name in weights:
            weights[prefix + name] = weights[prefix + name].transpose(1, 2)
        else:
            raise ValueError(f"checkpoint is missing weight {prefix + name!r}")
    out = {
        "gate_up_proj": deinterleave(weights.pop(prefix + "gate_up_proj"), dim=1),
        "down_proj": weights.pop(prefix + "down_proj"),
    }
    if prefix + "gate_up_proj_bias" in weights:  # else the loader names it missing
        out["gate_up_proj_bias"] = deinterleave(weights.pop(prefix + "gate_up_proj_bias"), -1)
    return out


def _gguf_experts(weights: dict[str, torch.Tensor], prefix: str) -> dict:
    """A GGUF file's experts (llama.cpp's converter splits gate and up, each [E, rows, in]
    with a bias [E, rows]) stacked as ours; only the biases where the matrices are kept as
    blocks (not in `weights`)."""

    def take(name: str) -> torch.Tensor:
        if prefix + name not in weights:
            raise ValueError(f"checkpoint is missing weight {prefix + name!r}")
        return weights.pop(prefix + name)

    out = {
        "gate_up_proj_bias": torch.cat([take("gate_proj.bias"), take("up_proj.bias")], -1),
        "down_proj_bias": take("down_proj.bias"),
    }
    if prefix + "gate_proj.weight" in weights:
        out["gate_up_proj"] = torch.cat([take("gate_proj.weight"), take("up_proj.weight")], 1)
        out["down_proj"] = take("down_proj.weight")
    return out


def deinterleave(gate_up: torch.Tensor, dim: int) -> torch.Tensor:
    """gate_up with gate in the even and up in the odd positions along `dim` -> gate's
    entries, then up's."""
    last = gate_up.movedim(dim, -1)
    return torch.cat([last[..., 0::2], last[..., 1::2]], dim=-1).movedim(-1, dim)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 (OCP microscaling): blocks uint8 [..., G, 16], two E2M1 values a byte (the low
    nibble first), and scales uint8 [..., G], one power-of-two exponent (biased by 127) per
    32 values -> float32 [..., G * 32]."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(
            f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match"
        )
    magnitudes = torch.tensor(_FP4_VALUES)
    lut = torch.cat([magnitudes, -magnitudes])  # 4-bit code -> value
    b = blocks.to(torch.int64)
    values = torch.stack([lut[b & 15], lut[b >> 4]], dim=-1).flatten(-2)  # (..., G, 32)
    exponents = scales.to(torch.int32) - 127
    return torch.ldexp(values, exponents[..., None]).flatten(-2)
