"""GGUF files (llama.cpp's format, how the default model ships): their config, tokenizer and
weights, converted once into an HF directory, or loaded with their quantization kept.

transformers reads a GGUF's tokenizer, and the config of the architectures it knows;
runtime/loading/gguf/configs.py completes or builds the config as llama.cpp reads the file. The
weights are read here with the `gguf` package. llama.cpp stores the q/k projection rows of
its Llama-style families (Llama, Mixtral, SmolLM3) permuted for its RoPE layout; they are put
back in the half-split layout our forward uses. Gemma 2/3 files keep q/k as they are and
store every norm weight as 1 + w (ours are w, as transformers'). Phi-3's fused attn_qkv and
ffn_up (gate's rows, then up's) load into our fused linears as they are. GPT-OSS's experts
(gate and up apart, each with a bias) load as our gate_up stack, their blocks kept (MXFP4,
as its files ship them, or any type with a kernel here).
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

from braid.kernels.cpu.quant import from_gguf
from braid.runtime.loading.gguf import configs as gguf_configs
from braid.runtime.loading.gguf.tensors import GGUFTensor, read_tensors
from braid.runtime.models import LlamaForCausalLM, ModelConfig
from braid.runtime.models.layers.quantized import QuantEmbedding, QuantLinear, QuantStack
from braid.runtime.models.llama import partial_rotary_rows, split_fused
from braid.runtime.models.moe import quantize_experts

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
# GPT-OSS's layers: the norm before the experts, each head's sink logit (llama.cpp's
# converter names it attn_sinks.weight; transformers' is self_attn.sinks), its router (with a
# bias) and experts (each projection with a bias [n_expert, rows]).
_GPT_OSS_LAYER_NAMES = _LAYER_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "attn_sinks": "self_attn.sinks",
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    # Phi-3's longrope factors: read into config.json (gguf_configs.py), no weight.
    "rope_factors_long.weight": "rope_factors_long.weight",
    "rope_factors_short.weight": "rope_factors_short.weight",
}
_FLOAT_TYPES = ("F32", "F16", "BF16")
_PERMUTED = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "SmolLM3ForCausalLM")


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
    """Write config.json and the tokenizer files for a GGUF, and a link to the file itself
    (its weights are read from there)."""
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
    architecture = config["architectures"][0]
    log.info("dequantizing %s to float32 into %s (once)", gguf_path, target)
    tensors = {
        _our_name(name, architecture): torch.tensor(w)  # a copy: w may view the read-only file
        for name, w in _dequantized(gguf_path, heads, kv_heads, architecture)
    }
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
# GGUF block types with a kernel, by the format they are kept in (kernels/cpu/quant.py).
_KEPT = {
    "Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4", "Q5_0": "q5", "Q5_1": "q5", "Q5_K": "q5",
    "Q8_0": "q8", "Q6_K": "q6", "IQ4_NL": "iq4", "IQ4_XS": "iq4", "MXFP4": "mxfp4",
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
    empty (their blocks come from elsewhere: runtime/loading/packed_weights.py)."""
    config = model.config
    arch = config.architecture
    # By our module paths (HF names without "model.").
    tensors = {
        _our_name(hf_name(t.name, arch), arch).removeprefix("model."): t
        for t in _model_tensors(gguf_path)
    }

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
            parts = [f"{path}.weight"]  # one tensor (Phi-3's are fused in the file too)
            if parts[0] not in tensors:
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
            bias = module.bias is not None  # a float parameter beside the blocks
            if len(set(formats)) == 1:  # one layer for the stack, the parts' rows in order
                layer = QuantLinear(module.in_features, sum(rows), formats[0], bias)
                firsts = [sum(rows[:i]) for i in range(len(parts))]
                fills += [(path, first, part) for first, part in zip(firsts, parts, strict=True)]
            else:  # a layer per part (GGUF's "_M" mixes keep v at more bits than q and k)
                shapes = zip(rows, formats, strict=True)
                stack = [QuantLinear(module.in_features, r, f) for r, f in shapes]
                layer = QuantStack(stack, bias)
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
        if part.endswith("qkv_proj.weight") and (rows := partial_rotary_rows(config)) is not None:
            ordered = ordered[rows.numpy()]  # a fused qkv's rows, as load_hf_weights moves them
        model.get_submodule(path).blocks[first : first + t.rows] = torch.from_numpy(ordered)
    floats = {_hf(name): _float(t, name, config) for name, t in tensors.items()}
    model.load_hf_weights(split_fused(floats, config))
    # Materialized in float32: the norms and biases must be in the activations' dtype, or a
    # bfloat16 residual meets float32 norms (and the float32-only decode stack is picked
    # over a bfloat16 KV pool). The blocks are uint8, which .to leaves alone.
    model.to(dtype)
    model.rotary.float().reset()


def _our_name(hf: str, architecture: str) -> str:
    """A tensor's HF name as our model holds it: Phi-3's ffn_up holds gate and up."""
    if architecture == "Phi3ForCausalLM":
        return hf.replace(".mlp.up_proj.", ".mlp.gate_up_proj.")
    return hf


def _model_tensors(gguf_path: Path) -> list[GGUFTensor]:
    """The file's tensors, an old Mixtral file's per-expert ones (blk.N.ffn_gate.E.weight)
    stacked per layer and projection as newer files store them (blk.N.ffn_gate_exps.weight,
    [n_expert, rows, row length]): a copy of their bytes, which loading copies anyway."""
    tensors, experts = [], {}
    for t in read_tensors(gguf_path):
        match = gguf_configs.OLD_EXPERT.fullmatch(t.name)
        if match is None:
            tensors.append(t)
            continue
        layer, proj, expert = match.groups()
        experts.setdefault((int(layer), proj), {})[int(expert)] = t
    for (layer, proj), parts in sorted(experts.items()):
        name = f"blk.{layer}.ffn_{proj}_exps.weight"
        ordered = [parts.get(e) for e in range(len(parts))]
        first = ordered[0]
        if None in ordered or any((t.type, t.shape) != (first.type, first.shape) for t in ordered):
            raise ValueError(
                f"{gguf_path}: the per-expert tensors of {name} are not experts 0..N-1 of one "
                "type and shape"
            )
        data = np.concatenate([t.data for t in ordered])  # (E rows, row bytes)
        tensors.append(GGUFTensor(name, first.type, (*first.shape[:2], len(ordered)), data))
    return tensors


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


def _save_config_and_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # transformers reads the file with the gguf package, which meets a malformed file with
    # struct.error, numpy's errors or gigabytes of arrays: our reader checks it first, and
    # what transformers still refuses (a value of the wrong kind) is said to be the file's.
    tensors = read_tensors(gguf_path)
    names = [t.name for t in tensors]
    try:
        meta = gguf_configs.metadata(gguf_path)
    except Exception as e:
        raise ValueError(f"{gguf_path}: transformers cannot read its metadata: {e}") from e
    arch = meta.get("general.architecture")
    if arch not in gguf_configs.ARCHITECTURES:
        raise ValueError(
            f"{gguf_path}: GGUF files of {arch} are unsupported; braid reads "
            f"{', '.join(gguf_configs.ARCHITECTURES)} (llama with experts: Mixtral)"
        )
    # The tokenizer as transformers builds it from the file: through its model class where
    # it knows the architecture, else by the file's tokenizer model alone.
    builder = PreTrainedTokenizerFast if gguf_configs.built_here(arch, names) else AutoTokenizer
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        builder.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)
    except Exception as e:
        raise ValueError(f"{gguf_path}: transformers cannot read its tokenizer: {e}") from e
    embedding = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise ValueError(f"{gguf_path}: the file has no token_embd.weight")
    gguf_configs.write_config(gguf_path, meta, names, embedding.rows, out_dir)


def _is_gemma(architecture: str) -> bool:
    return architecture.startswith("Gemma")


def _rope_permuted(architecture: str) -> bool:
    """Whether llama.cpp's converter permuted q/k rows for its RoPE layout (its Llama-style
    families': Llama, Mixtral, SmolLM3)."""
    return architecture in _PERMUTED


def _dequantized(gguf_path: Path, num_heads: int, num_kv_heads: int, architecture: str):
    """(HF name, float32 weight) of every tensor, q/k rows back in the half-split layout
    (a Llama-style family's), norms back to w (a Gemma's)."""
    gemma, permuted = _is_gemma(architecture), _rope_permuted(architecture)
    for t in _model_tensors(gguf_path):
        name = hf_name(t.name, architecture)
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


def hf_name(gguf_name: str, architecture: str) -> str:
    """A tensor's name in a transformers checkpoint of `architecture` (GPT-OSS's sinks have no
    .weight there)."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    if _is_gemma(architecture):
        names = _GEMMA_LAYER_NAMES
    elif architecture == "GptOssForCausalLM":
        names = _GPT_OSS_LAYER_NAMES
    else:
        names = _MOE_LAYER_NAMES
    blk, layer, part, kind = gguf_name.split(".")
    if part == "ffn_gate_up_exps":
        raise ValueError(
            f"GGUF tensor {gguf_name!r}: experts with gate and up fused (llama.cpp's "
            "convert_hf_to_gguf.py --fuse-gate-up-exps) are unsupported; convert without it"
        )
    if blk != "blk" or part not in names:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    if part == "attn_sinks":
        return f"model.layers.{layer}.{names[part]}"
    return f"model.layers.{layer}.{names[part]}.{kind}"


def unpermute_rope(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rope pairs -> half-split layout).
    Rows only: a quantized weight's rows of blocks move like a float weight's rows."""
    out_dim = w.shape[0]
    half = out_dim // num_heads // 2
    # llama.cpp stored rows as (heads, half, 2); HF wants (heads, 2, half).
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
