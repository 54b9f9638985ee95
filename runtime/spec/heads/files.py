"""Reading a draft head's directory: its config.json and its tensors, with errors that name
the file or the tensor at fault."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file


def read_config(path: Path) -> dict:
    """The head's config.json as a dict."""
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"EngineConfig.draft_model: {path} has no config.json")
    try:
        config = json.loads(file.read_text())
    except (ValueError, OSError) as e:
        raise ValueError(f"EngineConfig.draft_model: cannot read {file}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"EngineConfig.draft_model: {file} holds no JSON object")
    return config


def read_tensors(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a .safetensors file, or of a .pt state dict (loaded as weights only:
    no pickled code runs)."""
    try:
        if file.suffix == ".safetensors":
            return load_file(file)
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise ValueError(f"EngineConfig.draft_model: cannot read {file}: {e}") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ValueError(f"EngineConfig.draft_model: {file} holds no state dict of tensors")
    return state


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of every *.safetensors file in `path`."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"EngineConfig.draft_model: {path} has no *.safetensors file")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(read_tensors(file))
    return weights


def config_int(config: dict, file: Path, *keys: str) -> int:
    """The first of `keys` config.json holds, as a positive int."""
    for key in keys:
        if key in config:
            value = config[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineConfig.draft_model: {file}: {key} must be an int >= 1")
            return value
    raise ValueError(f"EngineConfig.draft_model: {file} has no {' or '.join(keys)}")


class Tensors:
    """A checkpoint's tensors, taken by name with their expected shape checked."""

    def __init__(self, weights: dict[str, torch.Tensor], where: Path) -> None:
        self.weights = weights
        self.where = where

    def __contains__(self, name: str) -> bool:
        return name in self.weights

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.weights:
            raise ValueError(f"EngineConfig.draft_model: {self.where} is missing tensor {name!r}")
        t = self.weights[name]
        if tuple(t.shape) != shape:
            raise ValueError(
                f"EngineConfig.draft_model: tensor {name!r} of {self.where} has shape "
                f"{tuple(t.shape)}, the target implies {shape}"
            )
        return t
