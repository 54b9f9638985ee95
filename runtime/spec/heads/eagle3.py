"""The EAGLE-3 draft layer (Li et al. 2025), as SGLang and vLLM load `LlamaForCausalLMEagle3`.

Draft row p pairs token p + 1 with a hidden state g_p of position p: for positions the target
computed, g_p = fc(concat of the target's hidden states at three layers); past them, the
draft's own output at p - 1 (before its final norm). One Llama decoder layer whose attention
reads concat(input_layernorm(embed(token)), hidden_norm(g)) (2 * hidden wide), with the
residual stream starting at g; then the final norm and a head over a draft vocabulary, whose
id i is target id i + d2t[i]. Row p's logits guess token p + 2.

Checkpoint tensors: fc, midlayer.* (or layers.0.*) with q/k/v/o, gate/up/down, hidden_norm,
input_layernorm, post_attention_layernorm; norm, lm_head, d2t, and embed_tokens when the
draft has its own (else the target's), all optionally under `model.`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models.config.model_config import ModelConfig
from braid.runtime.models.layers.ops import LayerOps
from braid.runtime.models.llama import MLP, Attention, RMSNorm, Rotary
from braid.runtime.spec.heads.files import Tensors, read_config, read_safetensors_dir


class Eagle3Head(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        target_hidden: int,
        num_aux: int,
        draft_vocab: int,
        embed_tokens: nn.Embedding,
        norm_before_residual: bool = False,
    ) -> None:
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.embed_tokens = embed_tokens
        self.fc = nn.Linear(num_aux * target_hidden, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.self_attn = Attention(config, 0, nn.Linear)
        attn = self.self_attn
        qkv = attn.q_size + 2 * attn.kv_size
        self.self_attn.qkv_proj = nn.Linear(2 * h, qkv, bias=config.attention_bias)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.mlp = MLP(config, 0, nn.Linear)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.int64))
        self.rotary = Rotary(config)
        self.norm_before_residual = norm_before_residual  # a variant vLLM reads from config

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, kv: KVPool, hidden: torch.Tensor, ops: LayerOps
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of batch (tokens p + 1) over hidden states g [T, hidden]: the draft-vocabulary
        logits [N, draft_vocab] of batch.logits_indices and their outputs before the final
        norm [N, hidden] (the next row's g)."""
        embeds = self.input_layernorm(self.embed_tokens(batch.input_ids), ops)
        if self.norm_before_residual:
            h = self.hidden_norm(hidden, ops)
            residual = h.clone()
        else:
            residual = hidden.clone()
            h = self.hidden_norm(hidden, ops)
        x = self.self_attn(torch.cat([embeds, h], -1), batch, kv, self.rotary, ops)
        x = self.mlp(self.post_attention_layernorm(x, ops, residual), batch, ops)
        rows = batch.logits_indices
        out = residual[rows]  # a copy: the final norm adds the MLP output into it
        return self.lm_head(self.norm(x[rows], ops, out)), out

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def aux_layers(config: dict, num_layers: int) -> tuple[int, ...]:
    """The target layers whose input streams (HiddenCapture.layers) the draft reads: vLLM's
    top-level `eagle_aux_hidden_state_layer_ids` name them so; SGLang's
    `eagle_config.eagle_aux_hidden_state_layer_ids` name the layers whose output they are
    (one less); by default (2, L // 2, L - 3), as both pick."""
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        ids = None if nested is None else [j + 1 for j in nested]
    if ids is None:
        ids = [2, num_layers // 2, num_layers - 3]
    if not all(isinstance(j, int) and 0 <= j <= num_layers for j in ids):
        raise ValueError(
            f"EngineConfig.draft_model: EAGLE-3 aux layers {list(ids)} must lie in "
            f"[0, {num_layers}] for a target of {num_layers} layers"
        )
    return tuple(ids)


def load_eagle3(path: Path, target) -> tuple[Eagle3Head, tuple[int, ...]]:
    """The draft layer in directory `path` for `target` (a LlamaForCausalLM), and the target
    layers it reads."""
    raw = read_config(path)
    file = path / "config.json"
    tc = target.config
    if raw.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"EngineConfig.draft_model: {file}: num_hidden_layers must be 1")
    fields = dict(architectures=["LlamaForCausalLM"], num_hidden_layers=1, eos_token_id=None,
                  tie_word_embeddings=False)  # fmt: skip
    defaults = dict(num_key_value_heads=raw.get("num_attention_heads"),
                    max_position_embeddings=tc.max_position_embeddings)  # fmt: skip
    try:
        config = ModelConfig.from_dict(defaults | raw | fields)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"EngineConfig.draft_model: {file}: {e!r}") from None
    # Rope tables as long as the target's context (its rope settings, as read, kept).
    longest = max(config.max_position_embeddings, tc.max_position_embeddings)
    config = dataclasses.replace(config, max_position_embeddings=longest)
    if config.vocab_size != tc.vocab_size:
        raise ValueError(
            f"EngineConfig.draft_model: {file}: vocab_size {config.vocab_size}, the target "
            f"has {tc.vocab_size}"
        )
    target_hidden = raw.get("target_hidden_size") or config.hidden_size
    if target_hidden != tc.hidden_size:
        raise ValueError(
            f"EngineConfig.draft_model: {file}: target_hidden_size {target_hidden}, the "
            f"target's hidden size is {tc.hidden_size}"
        )
    layers = aux_layers(raw, tc.num_layers)
    draft_vocab = raw.get("draft_vocab_size") or config.vocab_size
    weights = {}
    for name, t in read_safetensors_dir(path).items():
        name = name.removeprefix("model.").replace("midlayer.", "layers.0.")
        weights[name] = t
    w = Tensors(weights, path)
    h, vocab = config.hidden_size, config.vocab_size
    if "embed_tokens.weight" in w:
        embed = nn.Embedding(vocab, h, _weight=w.take("embed_tokens.weight", (vocab, h)).clone())
    elif h == tc.hidden_size:
        embed = target.embed_tokens  # shared, as SGLang and vLLM share it
    else:
        raise ValueError(
            f"EngineConfig.draft_model: {path} has no embed_tokens.weight and its hidden size "
            f"{h} is not the target's {tc.hidden_size}"
        )
    head = Eagle3Head(config, target_hidden, len(layers), draft_vocab, embed,
                      bool(raw.get("norm_before_residual", False)))  # fmt: skip
    attn, layer = head.self_attn, "layers.0."
    with torch.no_grad():
        head.fc.weight.copy_(w.take("fc.weight", (h, len(layers) * target_hidden)))
        qkv = [
            w.take(f"{layer}self_attn.{p}_proj.weight", (n, 2 * h))
            for p, n in (("q", attn.q_size), ("k", attn.kv_size), ("v", attn.kv_size))
        ]
        attn.qkv_proj.weight.copy_(torch.cat(qkv))
        if config.attention_bias:
            bias = [
                w.take(f"{layer}self_attn.{p}_proj.bias", (n,))
                for p, n in (("q", attn.q_size), ("k", attn.kv_size), ("v", attn.kv_size))
            ]
            attn.qkv_proj.bias.copy_(torch.cat(bias))
        attn.o_proj.weight.copy_(w.take(f"{layer}self_attn.o_proj.weight", (h, attn.q_size)))
        if config.o_proj_bias:
            attn.o_proj.bias.copy_(w.take(f"{layer}self_attn.o_proj.bias", (h,)))
        inter = config.intermediate_size
        gate_up = [w.take(f"{layer}mlp.{p}_proj.weight", (inter, h)) for p in ("gate", "up")]
        head.mlp.gate_up_proj.weight.copy_(torch.cat(gate_up))
        head.mlp.down_proj.weight.copy_(w.take(f"{layer}mlp.down_proj.weight", (h, inter)))
        for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
            getattr(head, norm).weight.copy_(w.take(f"{layer}{norm}.weight", (h,)))
        head.norm.weight.copy_(w.take("norm.weight", (h,)))
        head.lm_head.weight.copy_(w.take("lm_head.weight", (draft_vocab, h)))
        if "d2t" in w:
            head.d2t.copy_(w.take("d2t", (draft_vocab,)))
        elif draft_vocab != vocab:
            raise ValueError(
                f"EngineConfig.draft_model: {path} is missing tensor 'd2t' (its draft "
                f"vocabulary of {draft_vocab} is not the target's {vocab})"
            )
    ids = head.target_ids(torch.arange(draft_vocab))
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"EngineConfig.draft_model: {path}: d2t maps outside the vocabulary")
    return head, layers
