"""Find a model directory, read its config, build our model and fill it from safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from braid.kernels import cpu
from braid.runtime.loading import packed_weights
from braid.runtime.loading.default_model import INSTALL_HINT, default_model_dir
from braid.runtime.loading.gguf import files as gguf_file
from braid.runtime.models import LlamaForCausalLM, ModelConfig, build_model
from braid.runtime.models.config.model_config import missing_keys
from braid.runtime.models.layers.batch_invariant import BatchInvariantLinear
from braid.runtime.models.layers.ops import layer_ops
from braid.runtime.models.layers.quant_decoder import QuantDecoder
from braid.runtime.models.layers.quantized import QuantLinear
from braid.runtime.models.llama import split_fused
from braid.runtime.models.moe import Experts

if TYPE_CHECKING:
    from braid.runtime.tp.sharding import Shard


def resolve_model_dir(model: str | Path | None) -> Path:
    """None (or "default") means the embedded default model; a .gguf file is converted once
    into an HF directory (runtime/loading/gguf/files.py); anything else is an HF directory."""
    if model is None or str(model) == "default":
        return default_model_dir()
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return gguf_file.model_dir(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"model directory {path} does not exist (pass an HF model directory, or no model "
            f"for the default one; {INSTALL_HINT})"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json; is it a transformers model directory?")
    return path


def load_model_config(path: Path) -> ModelConfig:
    file = path / "config.json"
    try:
        config = json.loads(file.read_text())
        if missing_keys(config):  # transformers' per-architecture defaults fill them
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(path).to_dict()
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        raise ValueError(f"cannot read {file}: {e!r}") from None
    try:
        return ModelConfig.from_dict(config)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{file}: a value is missing or of the wrong type: {e!r}") from None


def load_model(
    path: Path,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    cpu_kernels: bool = True,
    deterministic: bool = False,
    quantization: str = "none",
    shard: Shard | None = None,
) -> LlamaForCausalLM:
    """The model on `device` in `dtype`; on the CPU its small ops and quantized linears run
    in the C++ kernels unless `cpu_kernels` is False (or they cannot be built here).
    `deterministic`: every row's output is the same whatever it is batched with
    (batch-invariant linears, attention row by row). `quantization` (CPU only): "int8" or
    "int4" quantizes every linear at load; "gguf" keeps the quantized tensors of the GGUF
    file the model came from.
    `shard`: only a tensor-parallel rank's share of the heads and MLP features (runtime/tp)."""
    if quantization != "none" and device.type != "cpu":
        raise ValueError(f"quantization={quantization!r}: quantized weights run on the CPU")
    if config.moe is not None and (deterministic or shard is not None):
        raise ValueError(
            f"{config.architecture} (mixture of experts): deterministic mode and tensor "
            "parallelism are not implemented for experts"
        )
    full_config = config
    if shard is not None:
        config = shard.model_config(config)
    linear = BatchInvariantLinear if deterministic else torch.nn.Linear
    with torch.device("meta"):
        model = build_model(config, linear)
    if quantization == "gguf":
        source = gguf_file.source(path)
        if source is None:
            raise ValueError(
                f"quantization='gguf': {path} was not converted from a GGUF file (pass the "
                ".gguf file, or no model for the default one)"
            )
        # On the CPU kernels, the blocks as they lay them out, mapped from the last load's.
        kernels = cpu.load() if cpu_kernels else None
        packed = packed_weights.path_for(path, source, kernels.quant_group) if kernels else None
        mapped = packed_weights.read(packed) if packed else {}
        gguf_file.load_quantized(model, source, dtype, skip=set(mapped))
        for name, (fmt, blocks) in mapped.items():
            layer = model.get_submodule(name)
            if layer.fmt != fmt:
                raise ValueError(f"{packed}: {name} is {fmt}, the GGUF's {layer.fmt}")
            layer.take_packed(blocks, kernels)
    else:
        model = model.materialize(device).to(dtype)
        # Rope tables are computed, not loaded, and stay fp32 whatever the weights' dtype.
        model.rotary.float().reset()
        weights = split_fused(_read_safetensors(path), full_config)
        if shard is not None:
            weights = shard.slice_weights(weights, config.head_dim)
        model.load_hf_weights(weights)
        if quantization in QUANTIZED_FORMATS:
            _quantize_linears(model, QUANTIZED_FORMATS[quantization])
    model.ops = layer_ops(device, dtype, cpu_kernels, deterministic)
    if cpu_kernels:
        for module in model.modules():
            if isinstance(module, QuantLinear):
                module.pack()
    if quantization == "gguf" and packed and not mapped:
        packed_weights.write(model, packed)
    model.decoder = QuantDecoder.of(model) if config.moe is None else None  # dense layers'
    return model.eval().requires_grad_(False)


# Engine(quantization=...) -> the format its linears are packed in (kernels/cpu/quant.py).
QUANTIZED_FORMATS = {"int4": "q4", "int8": "q8"}


def _quantize_linears(model: LlamaForCausalLM, fmt: str) -> None:
    """Every linear layer (the head included) and every expert kept as `fmt` blocks; a tied
    embedding table stays in floats for its lookups, and so do the experts' routers (a
    router's rounding would change which experts run)."""
    for path, module in list(model.named_modules()):
        if isinstance(module, Experts):
            model.set_submodule(path, module.to_blocks(fmt))
        elif isinstance(module, torch.nn.Linear) and not path.endswith(_ROUTERS):
            model.set_submodule(path, QuantLinear.of(module, fmt))


_ROUTERS = (".mlp.gate", ".mlp.router", ".mlp.shared_expert_gate")


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files and gguf_file.source(path) is not None:
        files = [gguf_file.float_weights(path).name]
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    weights = {}
    for name in files:
        try:
            weights.update(load_file(path / name))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"corrupt or unreadable weight file {path / name}: {e}") from None
    return weights
