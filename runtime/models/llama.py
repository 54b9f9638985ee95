"""The Llama family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3), our own forward.

Differences between the members are three switches in ModelConfig: q/k/v biases (Qwen2),
per-head q/k RMSNorm (Qwen3), and the rope flavour (default, linear, llama3, yarn).
q/k/v and gate/up are fused into one matmul each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from braid.runtime.executor.forward_batch import ForwardBatch, HiddenCapture
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models.config.model_config import ModelConfig
from braid.runtime.models.layers import rope
from braid.runtime.models.layers.ops import TORCH_OPS, LayerOps

if TYPE_CHECKING:
    from braid.runtime.models.layers.quant_decoder import QuantDecoder


class RMSNorm(nn.Module):
    """Holds the weight; LayerOps.add_rms_norm applies it (fused with the residual add)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: LayerOps, residual: torch.Tensor | None = None):
        """weight * rmsnorm(x); with `residual`, x is first added into it (in place) and the
        sum is normalised."""
        if residual is None:
            return ops.add_rms_norm(None, x, self.weight, self.eps)
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class Rotary(nn.Module):
    """cos/sin tables for every position (float32, [max_position, head_dim / 2]), applied in
    the half-split (non-interleaved) layout by the attention backend (runtime/attention)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        half = config.head_dim // 2
        self.register_buffer(
            "cos", torch.empty(config.max_position_embeddings, half), persistent=False
        )
        self.register_buffer(
            "sin", torch.empty(config.max_position_embeddings, half), persistent=False
        )
        if config.nope_layers:  # the tables of layers without rope (SmolLM3): cos 1, sin 0
            shape = (config.max_position_embeddings, half)
            self.register_buffer("nope_cos", torch.empty(shape), persistent=False)
            self.register_buffer("nope_sin", torch.empty(shape), persistent=False)
        self.reset()

    def reset(self) -> Rotary:
        """Compute the tables (again after the model was built on the meta device)."""
        with torch.device("cpu"):  # also when the model is being built on the meta device
            inv_freq, scale = self.config.rope_inv_freq()
            t = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
            freqs = torch.outer(t, inv_freq)  # (max_pos, R/2), R the rotated dims
            # cos and sin on the CPU: on the meta device they import torch's compiler stack.
            cos, sin = freqs.cos() * scale, freqs.sin() * scale
        # A partial rotary (R < D): the other pairs pass unrotated (the loader moved q/k's
        # dimensions so that pairs are (i, i + D/2): partial_rotary_rows).
        rotated = inv_freq.numel()
        self.cos[:, rotated:] = 1.0
        self.sin[:, rotated:] = 0.0
        self.cos[:, :rotated].copy_(cos)
        self.sin[:, :rotated].copy_(sin)
        if self.config.nope_layers:
            self.nope_cos.fill_(1.0)
            self.nope_sin.fill_(0.0)
        return self


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, linear: type[nn.Linear]) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = linear(self.q_size, config.hidden_size, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
        self.scale = self.head_dim**-0.5
        self.window = config.layer_windows[layer] if config.layer_windows else None  # Mistral
        self.rope = layer not in config.nope_layers  # SmolLM3's NoPE layers do not rotate
        self.sinks: torch.Tensor | None = None  # GPT-OSS: each head's sink logit
        self.softcap: float | None = None  # Gemma 2: scores capped before the softmax

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, kv: KVPool, rotary: Rotary, ops: LayerOps
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # (T, (H + 2 Hkv) * D)
        if batch.lora is not None:
            batch.lora.add(qkv, x, self.layer, "self_attn.qkv_proj")
        self.normalize_qk(qkv)
        cos, sin = self.rope_tables(rotary)
        sinks = None if self.sinks is None else self.sinks.float()
        out = ops.attention.forward(
            qkv, self.num_heads, self.num_kv_heads, cos, sin, kv, self.layer,
            batch, self.scale, window=self.window, softcap=self.softcap, sinks=sinks,
        )  # fmt: skip
        y = self.o_proj(out)
        if batch.lora is not None:
            batch.lora.add(y, out, self.layer, "self_attn.o_proj")
        return y

    def rope_tables(self, rotary: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) this layer rotates q and k by: SmolLM3's NoPE layers do not rotate."""
        return (rotary.cos, rotary.sin) if self.rope else (rotary.nope_cos, rotary.nope_sin)

    def normalize_qk(self, qkv: torch.Tensor) -> None:
        """The family's normalisation of q and k, in place in qkv (T, (H + 2 Hkv) * D):
        Qwen3's RMSNorm of each head."""
        if self.qk_norm:
            heads = qkv.view(qkv.shape[0], -1, self.head_dim)  # (T, H + 2 Hkv, D)
            q, k = heads[:, : self.num_heads], heads[:, self.num_heads : -self.num_kv_heads]
            q.copy_(self.q_norm(q, TORCH_OPS))
            k.copy_(self.k_norm(k, TORCH_OPS))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, linear: type[nn.Linear]) -> None:
        super().__init__()
        self.layer = layer
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, ops: LayerOps) -> torch.Tensor:
        lora = batch.lora
        gate_up = self.gate_up_proj(x)  # (T, 2 I)
        if lora is not None:
            lora.add(gate_up, x, self.layer, "mlp.gate_up_proj")
        h = self.activation(gate_up, ops)  # (T, I)
        y = self.down_proj(h)
        if lora is not None:
            lora.add(y, h, self.layer, "mlp.down_proj")
        return y

    def activation(self, gate_up: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        """SwiGLU: silu(gate) * up."""
        return ops.silu_mul(gate_up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, linear: type[nn.Linear]) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer, linear)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, layer, linear)

    def forward(
        self,
        x: torch.Tensor | None,
        residual: torch.Tensor,
        batch: ForwardBatch,
        kv: KVPool,
        rotary: Rotary,
        ops: LayerOps,
    ) -> torch.Tensor:
        """The residual stream is updated in place: the previous layer's output `x` (None for
        the first layer) is added into it before each norm. Returns this layer's MLP output,
        which the next layer (or the final norm) adds."""
        if x is None:
            h = self.input_layernorm(residual, ops)
        else:
            h = self.input_layernorm(x, ops, residual)
        h = self.post_attention_layernorm(self.self_attn(h, batch, kv, rotary, ops), ops, residual)
        return self.mlp(h, batch, ops)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, linear: type[nn.Linear] = nn.Linear) -> None:
        """`linear`: the class of every linear layer (BatchInvariantLinear in deterministic
        mode)."""
        super().__init__()
        self.config = config
        # Given its weight, the embedding skips its random init: on the meta device that init
        # imports torch's compiler stack, most of a start.
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.rotary = Rotary(config)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, linear) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.ops = TORCH_OPS  # the loader picks them for the device and dtype of the weights
        # The layers in one kernel call for decode batches (quant_decoder.py), when the
        # loader finds every linear quantized.
        self.decoder: QuantDecoder | None = None

    def materialize(self, device: torch.device | str) -> LlamaForCausalLM:
        """Uninitialized storage on `device` for a model built on the meta device (the loader
        fills it), the embedding tie kept. Module.to_empty does the same through empty_like,
        which on meta tensors imports torch's symbolic-shapes stack (a fifth of a start)."""
        self._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
        if self.config.tie_word_embeddings and isinstance(self.embed_tokens, nn.Embedding):
            self.lm_head.weight = self.embed_tokens.weight
        return self

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        kv: KVPool,
        num_layers: int | None = None,
        hidden_states: bool = False,
        capture: HiddenCapture | None = None,
    ) -> torch.Tensor:
        """Next-token logits [N, V] for the rows in batch.logits_indices, in the weights' dtype:
        greedy decoding takes the argmax of bfloat16 logits as they are (converting a batch's rows
        of the vocabulary cost a share of every step: docs/benchmarks.md), and the sampler and the
        logprobs convert to float32 themselves. With `num_layers`, only the first layers run before
        the head (a self-draft). With `hidden_states`, those rows' final normed hidden states
        [N, hidden] instead of logits (what embeddings are pooled from). `capture`: hidden
        states copied out for draft heads (HiddenCapture says which), the logits unchanged."""
        residual = self.embed_tokens(batch.input_ids)  # (T, hidden)
        depth = num_layers or len(self.layers)
        wanted = capture.layers if capture is not None else ()
        aux = None
        if wanted:
            aux = residual.new_empty(residual.shape[0], len(wanted), residual.shape[1])
        # The one-call decoder has no sliding window and one rope table: a windowed model, or
        # one with NoPE layers, runs layer by layer.
        plain = not (self.config.layer_windows or self.config.nope_layers)
        decoder = self.decoder if plain else None
        if decoder is not None and decoder.serves(batch):
            x = decoder(residual, batch, kv, depth, wanted, aux)
        else:
            x = None
            # Slicing a ModuleList builds a new one (an add_module call a layer, every step):
            # only to cut it.
            for i, layer in enumerate(self.layers if num_layers is None else self.layers[:depth]):
                _capture_stream(wanted, i, aux, residual, x)
                x = layer(x, residual, batch, kv, self.rotary, self.ops)
        _capture_stream(wanted, depth, aux, residual, x)
        # Only the rows whose logits are wanted go through the last add and norm.
        rows = batch.logits_indices
        x = self.norm(x[rows], self.ops, residual[rows])
        if capture is not None:
            capture.aux = None if aux is None else aux.flatten(1)
            capture.normed = x if capture.final else None
        return x if hidden_states else self.lm_head(x)

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy weights named as in transformers' checkpoints, fusing q/k/v and gate/up.
        Quantized layers (their `blocks`) are filled by their own loader."""
        own = self.state_dict()
        expected = {name for name in own if not name.endswith(".blocks")}
        if self.config.tie_word_embeddings:
            expected.discard("lm_head.weight")

        def put(name: str, tensor: torch.Tensor) -> None:
            if own[name].shape != tensor.shape:
                raise ValueError(
                    f"weight {name}: checkpoint has shape {tuple(tensor.shape)}, "
                    f"the config implies {tuple(own[name].shape)}"
                )
            own[name].copy_(tensor)

        def take(name: str) -> torch.Tensor:
            if name not in weights:
                raise ValueError(f"checkpoint is missing weight {name!r}")
            return weights[name]

        rows = partial_rotary_rows(self.config)  # q/k rows moved, for a partial rotary
        for name in sorted(expected):
            hf = "model." + name if not name.startswith("lm_head") else name
            if ".qkv_proj." in name:
                parts = [hf.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj")]
                qkv = torch.cat([take(p) for p in parts])
                put(name, qkv if rows is None else qkv[rows])
            elif ".gate_up_proj." in name:
                parts = [hf.replace("gate_up_proj", p) for p in ("gate_proj", "up_proj")]
                put(name, torch.cat([take(p) for p in parts]))
            else:
                put(name, take(hf))


def _capture_stream(
    wanted: tuple[int, ...], layer: int, aux: torch.Tensor | None, residual, x
) -> None:
    """Into aux[:, c] for each c with wanted[c] == layer: the residual stream entering
    `layer`, residual + x (x, the previous layer's output, is added into residual in place
    by the layer's first norm: the sum here is a copy, the stream itself untouched)."""
    for c, j in enumerate(wanted):
        if j != layer:
            continue
        if x is None:
            aux[:, c].copy_(residual)
        else:
            torch.add(residual, x, out=aux[:, c])


def partial_rotary_rows(config: ModelConfig) -> torch.Tensor | None:
    """The qkv projection's rows in our order for a partial rotary (R of D dimensions), None
    when whole heads rotate. transformers rotates pairs (i, i + R/2) of each q/k head and
    passes the last D - R dimensions; our attention rotates pairs (i, i + D/2), the pairs past
    R/2 with cos 1 and sin 0 (Rotary). q and k move alike, so their dot products, and the
    outputs, are the same."""
    d = config.head_dim
    r = rope.rotary_dim(config.rope_parameters, d)
    if r == d:
        return None
    if r % 2 or (d - r) % 2:
        raise ValueError(f"a partial rotary of {r} of {d} dimensions is unsupported")
    p = (d - r) // 2
    # Head position -> transformers' dimension: first halves of rotated pairs, half the
    # passed dimensions, second halves, the other passed half.
    head = torch.cat([
        torch.arange(r // 2), torch.arange(r, r + p), torch.arange(r // 2, r),
        torch.arange(r + p, d),
    ])  # fmt: skip
    qk_heads = config.num_heads + config.num_kv_heads
    rows = (torch.arange(qk_heads)[:, None] * d + head).flatten()  # q and k heads
    v = torch.arange(qk_heads * d, (qk_heads + config.num_kv_heads) * d)
    return torch.cat([rows, v])


def split_fused(weights: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A checkpoint's fused q/k/v and gate/up (Phi-3's qkv_proj and gate_up_proj) as views
    named as the Llama's separate projections (which load_hf_weights and tensor-parallel
    slicing read)."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    out = {}
    for name, w in weights.items():
        if ".self_attn.qkv_proj." in name:
            if w.shape[0] != q + 2 * kv:
                raise ValueError(
                    f"weight {name}: checkpoint has {w.shape[0]} rows, the config implies "
                    f"{q + 2 * kv}"
                )
            for part, piece in zip(
                ("q_proj", "k_proj", "v_proj"), w.split([q, kv, kv]), strict=True
            ):
                out[name.replace("qkv_proj", part)] = piece
        elif ".mlp.gate_up_proj." in name:
            for part, piece in zip(("gate_proj", "up_proj"), w.chunk(2), strict=True):
                out[name.replace("gate_up_proj", part)] = piece
        else:
            out[name] = w
    return out
