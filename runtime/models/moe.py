"""Mixture-of-experts decoders (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE), our own forward.

The Llama-shaped layers with the MLP replaced by a sparse block (transformers'
modeling_qwen3_moe.py and siblings are the reference, to the order of the casts):
- a router scores the experts (x @ gate^T), softmax in float32, the top k kept (renormalised
  to sum to 1 where norm_topk_prob says, always for Mixtral);
- the experts run grouped by expert over the batch's tokens: the (token, slot) pairs sorted by
  expert, one gate_up/down matmul pair per active expert on its tokens, the results weighted
  and scatter-added back;
- Qwen2-MoE adds a shared expert on every token, gated by sigmoid(x @ w);
- OLMoE RMS-normalises q and k over all heads at once (and may clamp q, k, v).
The experts' weights are held stacked per layer: gate_up_proj [E, 2 I, hidden] and
down_proj [E, hidden, I].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from braid.kernels.cpu.quant import FORMATS, from_gguf, quantize
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.loading.gguf.tensors import GGUFTensor
from braid.runtime.models.config.model_config import ModelConfig
from braid.runtime.models.config.moe import MoeConfig
from braid.runtime.models.layers.batch_invariant import BatchInvariantLinear
from braid.runtime.models.layers.ops import TORCH_OPS, LayerOps
from braid.runtime.models.layers.quantized import QuantLinear
from braid.runtime.models.llama import MLP, Attention, LlamaForCausalLM, RMSNorm


class Experts(nn.Module):
    """The experts' SwiGLU MLPs, stacked."""

    def __init__(self, moe: MoeConfig, hidden: int) -> None:
        super().__init__()
        self.moe, self.hidden = moe, hidden
        size = moe.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(moe.num_experts, 2 * size, hidden))
        self.down_proj = nn.Parameter(torch.empty(moe.num_experts, hidden, size))

    def run(self, expert: int, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        """Expert `expert`'s MLP on x (n, hidden) -> (n, hidden)."""
        h = ops.silu_mul(F.linear(x, self.gate_up_proj[expert]))  # (n, I)
        return F.linear(h, self.down_proj[expert])

    def quantized(self, gate_up_fmt: str, down_fmt: str) -> QuantExperts:
        """The same experts with their blocks kept in these formats (filled by its `fill`)."""
        return QuantExperts(self.moe, self.hidden, gate_up_fmt, down_fmt)

    def to_blocks(self, fmt: str) -> QuantExperts:
        """These experts with every expert's matrices quantized to `fmt` (int8/int4 at load);
        their other parameters (GPT-OSS's biases) kept as they are."""
        experts = self.quantized(fmt, fmt)
        for e in range(self.moe.num_experts):
            experts.gate_up[e].blocks = quantize(self.gate_up_proj[e], FORMATS[fmt])
            experts.down[e].blocks = quantize(self.down_proj[e], FORMATS[fmt])
        for name, p in self.named_parameters(recurse=False):
            if name not in ("gate_up_proj", "down_proj"):
                setattr(experts, name, p)
        return experts


class QuantExperts(nn.Module):
    """The experts with their GGUF blocks kept: a QuantLinear per expert for gate/up (gate's
    rows, then up's) and one for down, filled from slices of the file's stacked tensors."""

    def __init__(self, moe: MoeConfig, hidden: int, gate_up_fmt: str, down_fmt: str) -> None:
        super().__init__()
        size, n = moe.intermediate_size, moe.num_experts
        self.gate_up = nn.ModuleList(QuantLinear(hidden, 2 * size, gate_up_fmt) for _ in range(n))
        self.down = nn.ModuleList(QuantLinear(size, hidden, down_fmt) for _ in range(n))

    def run(self, expert: int, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        """As Experts.run, through the quantized matmul kernels."""
        return self.down[expert](ops.silu_mul(self.gate_up[expert](x)))

    def fill(self, parts: list[GGUFTensor], path: str, skip: set[str]) -> None:
        """Each expert's rows of the stacked gate, up and down tensors ([n_expert * rows, row
        bytes]) into its layers; those whose module path (`path`.gate_up.3, say) is in `skip`
        are left (their blocks come from elsewhere)."""
        gate, up, down = parts
        for name, layers, parts in (
            ("gate_up", self.gate_up, (gate, up)),
            ("down", self.down, (down,)),
        ):
            first = 0
            for t in parts:
                _, blocks = from_gguf(t.data, t.type, (t.rows, t.shape[0]))
                rows = t.rows // len(layers)  # (E rows, row bytes) -> each expert's rows
                for e, layer in enumerate(layers):
                    if f"{path}.{name}.{e}" not in skip:
                        layer.blocks[first : first + rows] = blocks[e * rows : (e + 1) * rows]
                first += rows


def quantize_experts(model: LlamaForCausalLM, tensors: dict, kept) -> list[tuple[str, list[str]]]:
    """Replace, in `model` (on the meta device), the Experts whose GGUF tensors (`tensors`, by
    our names) are quantized with their QuantExperts (Experts.quantized); `kept(name)`: a
    tensor's kernel format, None for floats. Returns (module path, its gate/up/down tensor
    names) to fill."""
    fills = []
    for path, module in list(model.named_modules()):
        if not isinstance(module, Experts):
            continue
        parts = [f"{path}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
        if not all(p in tensors for p in parts):
            continue
        formats = [kept(p) for p in parts]
        if formats == [None] * 3:
            continue  # float experts: load_hf_weights takes them stacked
        if None in formats or formats[0] != formats[1]:
            raise ValueError(
                f"{path}: experts' gate/up/down stored as {formats} (float and quantized, or "
                "gate and up apart) are unsupported; load with quantization='none'"
            )
        model.set_submodule(path, module.quantized(formats[0], formats[2]))
        fills.append((path, parts))
    return fills


def run_grouped(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    num_experts: int,
    run: Callable[[int, torch.Tensor, LayerOps], torch.Tensor],
    ops: LayerOps,
) -> torch.Tensor:
    """sum over each token's k experts of weight * expert(x): x (T, hidden), experts and
    weights (T, k); `run(expert, rows, ops)` is one expert's MLP on its rows. The (token,
    slot) pairs are grouped by expert, so each active expert runs once on all its tokens. A
    lone decode goes the same way: a token's experts are summed in one order (by expert)
    whatever the batch, which keeps the quantized experts batch-invariant."""
    flat = experts.flatten()  # (T k)
    order = torch.argsort(flat, stable=True)  # (T k) a stable sort keeps tokens in order
    tokens = order // experts.shape[1]  # (T k) the token of each sorted pair
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    xs = x[tokens]  # (T k, hidden)
    ys, start = [], 0
    for expert, n in enumerate(counts):
        if n:
            ys.append(run(expert, xs[start : start + n], ops))
            start += n
    y = torch.cat(ys) * weights.flatten()[order, None]  # (T k, hidden)
    return torch.zeros_like(x).index_add_(0, tokens, y.to(x.dtype))


class SparseMoe(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, linear: type[nn.Linear]) -> None:
        super().__init__()
        moe = config.moe
        self.layer = layer
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.norm_topk_prob = moe.norm_topk_prob
        # Mixtral weighs the experts' outputs in float32, the others in the activations' dtype.
        self.float_weights = config.architecture == "MixtralForCausalLM"
        # The router: a few dozen rows, so batch-invariant for free (which experts a token
        # takes must not depend on its batch: runtime/spec/lossless.py).
        self.gate = BatchInvariantLinear(config.hidden_size, moe.num_experts, bias=False)
        self.experts = Experts(moe, config.hidden_size)
        self.shared_expert = None
        if moe.shared_intermediate_size:
            shared = dataclasses.replace(config, intermediate_size=moe.shared_intermediate_size)
            self.shared_expert = MLP(shared, layer, linear)
            self.shared_expert_gate = BatchInvariantLinear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, ops: LayerOps) -> torch.Tensor:
        """x (T, hidden) -> the experts' weighted sum (T, hidden)."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # (T, E)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # (T, k)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        if not self.float_weights:
            weights = weights.to(x.dtype)
        out = run_grouped(x, experts, weights, self.num_experts, self.experts.run, ops)
        if self.shared_expert is not None:
            shared = self.shared_expert.down_proj(ops.silu_mul(self.shared_expert.gate_up_proj(x)))
            out += torch.sigmoid(self.shared_expert_gate(x)) * shared
        return out


class OlmoeAttention(Attention):
    """Llama's attention with q and k RMS-normalised over all their heads together, then q, k
    and v clamped to +-clip_qkv where the config sets it."""

    def __init__(self, config: ModelConfig, layer: int, linear: type[nn.Linear]) -> None:
        super().__init__(config, layer, linear)
        self.q_norm = RMSNorm(self.q_size, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.kv_size, config.rms_norm_eps)
        self.clip = config.moe.clip_qkv

    def normalize_qk(self, qkv: torch.Tensor) -> None:
        q = qkv[:, : self.q_size]  # (T, H D)
        k = qkv[:, self.q_size : self.q_size + self.kv_size]  # (T, Hkv D)
        q.copy_(self.q_norm(q.contiguous(), TORCH_OPS))
        k.copy_(self.k_norm(k.contiguous(), TORCH_OPS))
        if self.clip is not None:
            qkv.clamp_(-self.clip, self.clip)


class MoeForCausalLM(LlamaForCausalLM):
    """The Llama decoder with SparseMoe MLPs in the layers config.moe.sparse_layers names
    (OlmoeAttention in OLMoE's). The fused decode kernel (quant_decoder.py) is the dense
    shape's: the loader leaves `decoder` None, and the layers run one by one."""

    def __init__(self, config: ModelConfig, linear: type[nn.Linear] = nn.Linear) -> None:
        super().__init__(config, linear)
        for i, layer in enumerate(self.layers):
            if config.moe.sparse_layers[i]:
                layer.mlp = SparseMoe(config, i, linear)
            if config.moe.olmoe_qk_norm:
                layer.self_attn = OlmoeAttention(config, i, linear)

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """transformers' checkpoint names (one tensor per expert and projection, Mixtral's
        block_sparse_moe.experts.N.w1/w3/w2 too), or a GGUF's experts stacked per projection
        (mlp.experts.gate_proj.weight [E, I, hidden]), stacked per layer as Experts holds
        them. QuantExperts were filled by their own loader."""
        renamed = {}
        for name, w in weights.items():
            name = name.replace(".block_sparse_moe.", ".mlp.")
            if name.endswith("shared_expert_gate.weight") and w.dim() == 1:
                w = w[None]  # a GGUF's [hidden] -> (1, hidden)
            renamed[name] = w
        for i, layer in enumerate(self.layers):
            if not isinstance(layer.mlp, SparseMoe) or not isinstance(layer.mlp.experts, Experts):
                continue
            prefix = f"model.layers.{i}.mlp.experts."
            stacked = [f"{prefix}{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
            if all(k in renamed for k in stacked):
                gate, up, down = (renamed.pop(k) for k in stacked)
                gate_up = torch.cat([gate, up], dim=1)  # (E, 2 I, hidden)
            else:
                parts = [
                    _expert_weights(renamed, f"{prefix}{e}.")
                    for e in range(self.config.moe.num_experts)
                ]
                gate_up = torch.stack([torch.cat([g, u]) for g, u, _ in parts])
                down = torch.stack([d for _, _, d in parts])  # (E, hidden, I)
            renamed[prefix + "gate_up_proj"] = gate_up
            renamed[prefix + "down_proj"] = down
        super().load_hf_weights(renamed)


# An expert's (gate, up, down) weights: transformers' names, Mixtral's.
_EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


def _expert_weights(weights: dict[str, torch.Tensor], prefix: str) -> list[torch.Tensor]:
    for names in _EXPERT_NAMES:
        keys = [f"{prefix}{n}.weight" for n in names]
        if all(k in weights for k in keys):
            return [weights.pop(k) for k in keys]
    raise ValueError(
        f"checkpoint is missing the expert weights {prefix}gate_proj/up_proj/down_proj"
    )
