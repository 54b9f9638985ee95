"""GGUF files (llama.cpp's format, how the default model ships): their config, tokenizer and
weights, converted once into an HF directory, or loaded with their quantization kept.

transformers reads a GGUF's config and tokenizer; the weights are read here with the `gguf`
package. llama.cpp stores a Llama's q/k projection rows permuted for its RoPE layout; they are
put back in the half-split layout our forward uses. Gemma 2/3 files (llama.cpp's "gemma2" and
"gemma3") keep q/k as they are, store every norm weight as 1 + w (ours are w, as
transformers'), and leave some settings to llama.cpp's defaults for the family (_GEMMA_CONFIG).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from braid.kernels.quant import from_gguf
from braid.runtime.gguf_tensors import GGUFTensor, read_tensors
from braid.runtime.models import LlamaForCausalLM, ModelConfig
from braid.runtime.models.moe import quantize_experts
from braid.runtime.models.quantized import QuantEmbedding, QuantLinear, QuantStack

log = logging.getLogger(__name__)

SOURCE_LINK = "source.gguf"  # in a converted directory: the file it came from
# Files whose presence marks a finished conversion (the directory is renamed into place last).
# The float32 weights (FLOAT_WEIGHTS) are written only when a float model is asked for: the
# default is to run the file's own blocks, and a 1B model's floats take 4 GB of disk.
_CACHE_FILES = ("config.json", "tokenizer.json")
FLOAT_WEIGHTS = "model.safetensors"

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",  # fused (Phi-3)
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma's layers: both norms around attention and around the MLP, and Gemma 3's q/k norms.
_GEMMA_LAYER_NAMES = _LAYER_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# transformers' model_type of a GGUF's config -> (llama.cpp's architecture, HF architecture).
_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3_text": ("gemma3", "Gemma3ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "qwen2_moe": ("qwen2moe", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("qwen3moe", "Qwen3MoeForCausalLM"),
}
# Mixture-of-experts layers (runtime/models/moe.py): the router, the experts' stacked
# [n_expert, rows, row length] tensors (kept stacked, under our Experts' names without the
# fusion), Qwen2-MoE's shared expert and its gate, Qwen3's q/k norms.
_MOE_LAYER_NAMES = _LAYER_NAMES | {
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    # Phi-3's longrope factors: read into config.json (_complete_phi3_config), no weight.
    "rope_factors_long.weight": "rope_factors_long.weight",
    "rope_factors_short.weight": "rope_factors_short.weight",
}
_FLOAT_TYPES = ("F32", "F16", "BF16")


def cache_root() -> Path:
    return Path(os.environ.get("BRAID_MODEL_CACHE", Path.home() / ".cache" / "braid" / "models"))


def model_dir(gguf_path: Path, name: str | None = None) -> Path:
    """The HF directory converted from a GGUF file, converting it on first use (into
    BRAID_MODEL_CACHE, default ~/.cache/braid/models, under `name` or one made from the
    file's name, size and time)."""
    if name is None:
        stat = gguf_path.stat()
        tag = hashlib.sha256(f"{gguf_path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
        name = f"{gguf_path.stem}-{tag.hexdigest()[:8]}"
    target = cache_root() / name
    if all((target / f).is_file() for f in _CACHE_FILES):
        if not (target / SOURCE_LINK).is_symlink():  # converted before the link was kept
            (target / SOURCE_LINK).symlink_to(gguf_path.resolve())
        return target
    log.info("converting %s into %s (once)", gguf_path, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        convert(gguf_path, tmp)
        if target.exists():  # a stale, partial conversion
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if all((target / f).is_file() for f in _CACHE_FILES):
            return target  # another process converted it meanwhile
        raise
    return target


def convert(gguf_path: Path, out_dir: Path) -> None:
    """Write config.json and the tokenizer files for a Llama GGUF, and a link to the file
    itself (its weights are read from there)."""
    _save_config_and_tokenizer(gguf_path, out_dir)
    (out_dir / SOURCE_LINK).symlink_to(gguf_path.resolve())


def float_weights(model_dir: Path) -> Path:
    """The converted directory's float32 safetensors, dequantized from its GGUF file on first
    use (once: later loads read the file)."""
    from safetensors.torch import save_file

    target = model_dir / FLOAT_WEIGHTS
    if target.is_file():
        return target
    gguf_path = source(model_dir)
    if gguf_path is None:
        raise FileNotFoundError(f"{model_dir} has no {FLOAT_WEIGHTS} and no GGUF file to make it")
    config = json.loads((model_dir / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    gemma = _is_gemma(config["architectures"][0])
    permuted = _rope_permuted(config["architectures"][0])
    log.info("dequantizing %s to float32 into %s (once)", gguf_path, target)
    tensors = {
        name: torch.tensor(w)  # a copy: w may view the read-only file
        for name, w in _dequantized(gguf_path, heads, kv_heads, gemma, permuted)
    }
    if config["architectures"][0] == "Phi3ForCausalLM":  # its ffn_up holds gate and up
        tensors = {k.replace(".mlp.up_proj.", ".mlp.gate_up_proj."): w for k, w in tensors.items()}
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, target)  # concurrent loads never read half a file
    return target


def source(model_dir: Path) -> Path | None:
    """The GGUF file a converted directory came from, if it did."""
    link = model_dir / SOURCE_LINK
    return link.resolve() if link.is_symlink() and link.resolve().is_file() else None


# A fused linear of ours and the GGUF tensors whose rows it stacks, in order.
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# GGUF block types with a kernel, by the format they are kept in (kernels/quant.py).
_KEPT = {
    "Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4", "Q5_0": "q5", "Q5_1": "q5", "Q5_K": "q5",
    "Q8_0": "q8", "Q6_K": "q6", "IQ4_NL": "iq4", "IQ4_XS": "iq4",
}  # fmt: skip


def block_types(gguf_path: Path) -> list[str]:
    """The quantized block types of the file's tensors (floats left out), sorted."""
    types = {t.type.name for t in read_tensors(gguf_path)}
    return sorted(types - set(_FLOAT_TYPES))


def without_kernel(types: list[str]) -> list[str]:
    """The GGUF block types among `types` that no quantized kernel here reads."""
    return [t for t in types if t not in _KEPT]


def load_quantized(
    model: LlamaForCausalLM, gguf_path: Path, dtype: torch.dtype, skip: set[str] = frozenset()
) -> None:
    """Fill `model`, built on the meta device, from the GGUF file: linears whose tensors are
    quantized become QuantLinears (QuantStacks where a fused linear's parts are stored in
    different formats) holding those blocks (never expanded to floats), a quantized
    embedding table a QuantEmbedding (the head too when the model ties them), the float
    tensors parameters in `dtype`. The QuantLinears at the module paths in `skip` are left
    empty (their blocks come from elsewhere: runtime/packed_weights.py)."""
    config = model.config
    if config.architecture == "Phi3ForCausalLM":
        raise ValueError(
            f"{gguf_path}: a Phi-3 GGUF's blocks are not run as they are yet (fused attn_qkv "
            "and ffn_up); load it with quantization='none'"
        )
    gemma = _is_gemma(config.architecture)
    # By our module paths (HF names without "model.").
    tensors = {hf_name(t.name, gemma).removeprefix("model."): t for t in read_tensors(gguf_path)}

    def kept(name: str) -> str | None:
        t = tensors.get(name)
        if t is None or t.type.name in _FLOAT_TYPES:
            return None
        if t.type.name not in _KEPT:
            raise ValueError(
                f"{gguf_path}: {name} is {t.type.name}, which has no quantized kernel "
                f"here (kept: {', '.join(_KEPT)}); load it with quantization='none'"
            )
        return _KEPT[t.type.name]

    # Which quantized layers take which GGUF tensors: (our module path, first row, tensor).
    fills: list[tuple[str, int, str]] = []
    with torch.device("meta"):
        for path, module in list(model.named_modules()):
            if not isinstance(module, nn.Linear):
                continue
            parent, _, child = path.rpartition(".")
            prefix = parent + "." if parent else ""
            parts = [prefix + p + ".weight" for p in _FUSED.get(child, (child,))]
            if not all(p in tensors for p in parts):
                continue
            formats = [kept(p) for p in parts]
            if formats == [None] * len(parts):
                continue
            if None in formats:
                raise ValueError(
                    f"{gguf_path}: {path} stacks float and quantized tensors; load it with "
                    "quantization='none'"
                )
            rows = [tensors[p].rows for p in parts]
            if len(set(formats)) == 1:  # one layer for the stack, the parts' rows in order
                layer = QuantLinear(module.in_features, sum(rows), formats[0])
                firsts = [sum(rows[:i]) for i in range(len(parts))]
                fills += [(path, first, part) for first, part in zip(firsts, parts, strict=True)]
            else:  # a layer per part (GGUF's "_M" mixes keep v at more bits than q and k)
                shapes = zip(rows, formats, strict=True)
                layer = QuantStack([QuantLinear(module.in_features, r, f) for r, f in shapes])
                fills += [(f"{path}.parts.{i}", 0, part) for i, part in enumerate(parts)]
            model.set_submodule(path, layer)
        table_format = kept("embed_tokens.weight")
        if table_format is not None:
            table = QuantLinear(config.hidden_size, config.vocab_size, table_format)
            model.embed_tokens = QuantEmbedding(table, dtype)
            fills.append(("embed_tokens.table", 0, "embed_tokens.weight"))
            if config.tie_word_embeddings and not any(f[0] == "lm_head" for f in fills):
                model.lm_head = table
        expert_fills = quantize_experts(model, tensors, kept) if config.moe else []
    model.materialize("cpu")
    for path, parts in expert_fills:  # a mixture of experts' stacked blocks
        model.get_submodule(path).fill([tensors.pop(p) for p in parts], path, skip)
    for path, first, part in fills:
        t = tensors.pop(part)
        if path in skip:
            continue
        _, blocks = from_gguf(t.data, t.type, (t.rows, t.shape[0]))
        ordered = _rows_in_our_order(part, blocks.numpy(), config)
        model.get_submodule(path).blocks[first : first + t.rows] = torch.from_numpy(ordered)
    model.load_hf_weights({_hf(name): _float(t, name, config) for name, t in tensors.items()})
    model.rotary.float().reset()


def _hf(name: str) -> str:
    return name if name.startswith("lm_head") else "model." + name


def _float(t: GGUFTensor, name: str, config: ModelConfig) -> torch.Tensor:
    w = _rows_in_our_order(name, _floats(t), config)
    if _is_gemma(config.architecture) and name.endswith("norm.weight"):
        w = w - 1  # llama.cpp stores Gemma's norms as 1 + w
    return torch.tensor(w)  # a copy: t is read-only


def _floats(t: GGUFTensor) -> np.ndarray:
    """A tensor's values as float32 in torch's shape (ggml's dimensions reversed)."""
    import gguf

    w = np.asarray(gguf.quants.dequantize(t.data, t.type), dtype=np.float32)
    return w.reshape(tuple(reversed(t.shape)))


def _rows_in_our_order(name: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """A tensor's rows put back from llama.cpp's RoPE order (a Llama's q and k projections)."""
    if not _rope_permuted(config.architecture):
        return w
    if name.endswith("q_proj.weight"):
        return unpermute_rope(w, config.num_heads)
    if name.endswith("k_proj.weight"):
        return unpermute_rope(w, config.num_kv_heads)
    return w


def _save_config_and_tokenizer(gguf_path: Path, out_dir: Path):
    from transformers import AutoConfig, AutoTokenizer

    # transformers reads the file with the gguf package, which meets a malformed file with
    # struct.error, numpy's errors or gigabytes of arrays: our reader checks it first, and
    # what transformers still refuses (a value of the wrong kind) is said to be the file's.
    read_tensors(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except Exception as e:
        raise ValueError(
            f"{gguf_path}: transformers cannot read its config and tokenizer: {e}"
        ) from e
    if config.model_type not in _ARCHITECTURES:
        raise ValueError(
            f"{gguf_path}: GGUF files of {config.model_type} are unsupported; braid reads "
            f"{', '.join(arch for arch, _ in _ARCHITECTURES.values())}"
        )
    arch, hf_arch = _ARCHITECTURES[config.model_type]
    if arch == "llama" and any(t.name.endswith("_exps.weight") for t in read_tensors(gguf_path)):
        raise ValueError(
            f"{gguf_path}: a llama GGUF with experts (Mixtral) is unsupported; braid reads "
            "Mixtral from its HF directory, and qwen2moe/qwen3moe GGUF files"
        )
    config.architectures = [hf_arch]
    config.save_pretrained(out_dir)
    if arch in ("gemma2", "gemma3"):
        _complete_gemma_config(gguf_path, arch, out_dir)
    elif arch == "phi3":
        _complete_phi3_config(gguf_path, out_dir)
    elif arch != "llama":
        _complete_moe_config(gguf_path, arch, out_dir)
    return config


def _metadata(gguf_path: Path) -> dict:
    """The file's key/value metadata (tokenizer arrays left out; the reader parses them all,
    seconds for a large vocabulary: read once, at conversion)."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    return {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith("tokenizer.ggml.") and not name.startswith("GGUF.")
    }


def _is_gemma(architecture: str) -> bool:
    return architecture.startswith("Gemma")


def _complete_gemma_config(gguf_path: Path, arch: str, out_dir: Path) -> None:
    """What transformers' GGUF reader leaves out of a Gemma config.json, as llama.cpp reads
    the file (src/llama-model.cpp): query scaling by the head size (by hidden / heads for
    Gemma 3 27B, 62 layers), the soft-caps, Gemma 3's sliding-window pattern (every sixth
    layer global, unless the file says), the local rope base 10,000 and the global layers'
    rope scaling; <end_of_turn> ends generation as it does there."""
    meta = _metadata(gguf_path)
    file = out_dir / "config.json"
    config = json.loads(file.read_text())
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    head_dim = meta.get(f"{arch}.attention.key_length") or config["head_dim"]
    config["head_dim"] = head_dim
    big = arch == "gemma3" and layers == 62
    config["query_pre_attn_scalar"] = hidden // config["num_attention_heads"] if big else head_dim
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if f"{arch}.{key}" in meta:
            config[key] = float(meta[f"{arch}.{key}"])
        elif arch == "gemma3":
            config[key] = None
    if f"{arch}.attention.sliding_window" in meta:
        config["sliding_window"] = int(meta[f"{arch}.attention.sliding_window"])
    if arch == "gemma3":
        pattern = int(meta.get(f"{arch}.attention.sliding_window_pattern", 6))
        config["layer_types"] = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
        theta = float(meta.get(f"{arch}.rope.freq_base", 1e6))
        full = {"rope_type": "default", "rope_theta": theta}
        if meta.get(f"{arch}.rope.scaling.type") == "linear":
            full |= {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
        config["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }
    tokens = json.loads((out_dir / "tokenizer.json").read_text())["model"]["vocab"]
    end_of_turn = tokens.get("<end_of_turn>") if isinstance(tokens, dict) else None
    eos = config.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if end_of_turn is not None and end_of_turn not in eos:
        config["eos_token_id"] = [*eos, end_of_turn]
    file.write_text(json.dumps(config, indent=2))


def _complete_phi3_config(gguf_path: Path, out_dir: Path) -> None:
    """What transformers' GGUF reader leaves out of a Phi-3 config.json, as llama.cpp's
    converter writes it: the rotated share of a head, the original context, longrope's
    factors (the rope_factors_long/short tensors) and attention factor, the sliding window
    (which transformers applies; llama.cpp turns Phi's off)."""
    meta = _metadata(gguf_path)
    file = out_dir / "config.json"
    config = json.loads(file.read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    rotated = int(meta.get("phi3.rope.dimension_count", head_dim))
    rope = {
        "rope_type": "default",
        "rope_theta": float(meta.get("phi3.rope.freq_base", 10_000.0)),
        "partial_rotary_factor": rotated / head_dim,
    }
    factors = {
        t.name: _floats(t).tolist()
        for t in read_tensors(gguf_path)
        if t.name.startswith("rope_factors_")
    }
    if factors:
        rope |= {
            "rope_type": "longrope",
            "long_factor": factors["rope_factors_long.weight"],
            "short_factor": factors["rope_factors_short.weight"],
        }
        if "phi3.rope.scaling.attn_factor" in meta:
            rope["attention_factor"] = float(meta["phi3.rope.scaling.attn_factor"])
    original = meta.get("phi3.rope.scaling.original_context_length")
    if original:
        config["original_max_position_embeddings"] = int(original)
        rope["original_max_position_embeddings"] = int(original)
    config["rope_parameters"] = rope
    config["sliding_window"] = int(meta.get("phi3.attention.sliding_window", 0)) or None
    file.write_text(json.dumps(config, indent=2))


def _complete_moe_config(gguf_path: Path, arch: str, out_dir: Path) -> None:
    """What transformers' GGUF reader leaves out of a Qwen2/3-MoE config.json, as llama.cpp
    reads the file: the experts' and the shared expert's sizes, every layer sparse, Qwen3-MoE's
    top-k renormalised (Qwen2-MoE's not), Qwen2's q/k/v biases."""
    meta = _metadata(gguf_path)
    file = out_dir / "config.json"
    config = json.loads(file.read_text())
    config["moe_intermediate_size"] = int(meta[f"{arch}.expert_feed_forward_length"])
    if f"{arch}.expert_shared_feed_forward_length" in meta:
        config["shared_expert_intermediate_size"] = int(
            meta[f"{arch}.expert_shared_feed_forward_length"]
        )
    config |= {"decoder_sparse_step": 1, "mlp_only_layers": []}
    config["norm_topk_prob"] = arch == "qwen3moe"
    if arch == "qwen2moe":
        config["qkv_bias"] = True
    file.write_text(json.dumps(config, indent=2))


def _rope_permuted(architecture: str) -> bool:
    """Whether llama.cpp's converter permuted q/k rows for its RoPE layout (a Llama's only)."""
    return architecture in ("LlamaForCausalLM", "MistralForCausalLM")


def _dequantized(
    gguf_path: Path, num_heads: int, num_kv_heads: int, gemma: bool = False, permuted: bool = True
):
    """(HF name, float32 weight) of every tensor, q/k rows back in the half-split layout
    (a Llama's, `permuted`), norms back to w (a Gemma's)."""
    for t in read_tensors(gguf_path):
        name = hf_name(t.name, gemma)
        w = _floats(t)
        if gemma:
            if name.endswith("norm.weight"):
                w = w - 1
        elif not permuted:
            pass
        elif name.endswith("q_proj.weight"):
            w = unpermute_rope(w, num_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_rope(w, num_kv_heads)
        yield name, w


def hf_name(gguf_name: str, gemma: bool = False) -> str:
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    names = _GEMMA_LAYER_NAMES if gemma else _MOE_LAYER_NAMES
    blk, layer, part, kind = gguf_name.split(".")
    if blk != "blk" or part not in names:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{layer}.{names[part]}.{kind}"


def unpermute_rope(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rope pairs -> half-split layout).
    Rows only: a quantized weight's rows of blocks move like a float weight's rows."""
    out_dim = w.shape[0]
    half = out_dim // num_heads // 2
    # llama.cpp stored rows as (heads, half, 2); HF wants (heads, 2, half).
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
