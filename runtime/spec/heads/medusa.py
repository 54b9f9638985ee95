"""Medusa heads (Cai et al. 2024): K heads over the target's final normed hidden state h at a
position, head k guessing the token k + 2 places after it (the target's own head guesses the
next one). Head k is a stack of residual blocks x -> x + SiLU(A x + b), then its own vocabulary
projection.

Two published layouts load: FasterDecoding/Medusa's (medusa_lm_head.safetensors or .pt,
tensors `{k}.{l}.linear.weight/bias` and `{k}.{layers}.weight`, config.json
`medusa_num_heads` / `medusa_num_layers`) and vLLM's MedusaModel (*.safetensors, tensors
`blocks.{k}.layers.{l}.weight` (with `.bias` when `medusa_fc_bias`) and `lm_heads.{k}.weight`,
optionally under `medusa_heads.`; config.json `num_heads` / `num_hidden_layers`;
`original_lm_head`: one projection `lm_heads.0.weight` shared by every head).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from braid.runtime.spec.heads import files

FASTER_DECODING_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


class MedusaHeads(nn.Module):
    def __init__(
        self, num_heads: int, num_layers: int, hidden: int, vocab: int, bias: bool
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleList(nn.Linear(hidden, hidden, bias=bias) for _ in range(num_layers))
            for _ in range(num_heads)
        )
        self.lm_heads = nn.ModuleList(
            nn.Linear(hidden, vocab, bias=False) for _ in range(num_heads)
        )

    @property
    def num_heads(self) -> int:
        return len(self.lm_heads)

    @torch.inference_mode()
    def forward(self, hidden: torch.Tensor, heads: range) -> torch.Tensor:
        """Logits [len(heads), N, vocab] of the given heads for final normed hidden states
        [N, hidden]."""
        out = []
        for k in heads:
            x = hidden
            for linear in self.blocks[k]:
                x = x + nn.functional.silu(linear(x))
            out.append(self.lm_heads[k](x))
        return torch.stack(out)


def load_medusa(path: Path, hidden: int, vocab: int) -> MedusaHeads:
    """The heads in directory `path` for a target of `hidden` size and `vocab` rows, in
    either layout (the file names tell which)."""
    config = files.read_config(path)
    file = path / "config.json"
    found = [path / f for f in FASTER_DECODING_FILES if (path / f).is_file()]
    if found:
        num_heads = files.config_int(config, file, "medusa_num_heads")
        num_layers = files.config_int(config, file, "medusa_num_layers")
        weights = files.Tensors(_strip(files.read_tensors(found[0]), "medusa_head."), found[0])
        block = "{k}.{l}.linear"
        lm_head = "{k}.{layers}.weight"
        bias = True
    elif list(path.glob("*.safetensors")):
        num_heads = files.config_int(config, file, "num_heads", "medusa_num_heads")
        num_layers = files.config_int(config, file, "num_hidden_layers", "medusa_num_layers")
        weights = files.Tensors(_strip(files.read_safetensors_dir(path), "medusa_heads."), path)
        block = "blocks.{k}.layers.{l}"
        lm_head = "lm_heads.0.weight" if config.get("original_lm_head") else "lm_heads.{k}.weight"
        bias = bool(config.get("medusa_fc_bias", False))
        truncated = config.get("truncated_vocab_size")
        if truncated is not None and truncated != config.get("vocab_size", truncated):
            raise ValueError(
                f"EngineConfig.draft_model: {file}: truncated_vocab_size (a token_map) is "
                "not supported"
            )
    else:
        raise ValueError(
            f"EngineConfig.draft_model: {path} has no {' or '.join(FASTER_DECODING_FILES)} "
            "(FasterDecoding/Medusa) and no *.safetensors (vLLM's MedusaModel)"
        )
    heads = MedusaHeads(num_heads, num_layers, hidden, vocab, bias)
    with torch.no_grad():
        for k in range(num_heads):
            for layer, linear in enumerate(heads.blocks[k]):
                name = block.format(k=k, l=layer)
                linear.weight.copy_(weights.take(f"{name}.weight", (hidden, hidden)))
                if bias:
                    linear.bias.copy_(weights.take(f"{name}.bias", (hidden,)))
            name = lm_head.format(k=k, layers=num_layers)
            heads.lm_heads[k].weight.copy_(weights.take(name, (vocab, hidden)))
    return heads


def _strip(weights: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {name.removeprefix(prefix): t for name, t in weights.items()}
