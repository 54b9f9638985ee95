"""Tokenizer loading (its chat template checked) and the set of token ids that end
generation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from braid.runtime.text import template_render

if TYPE_CHECKING:  # chat templates use adds_bos without importing transformers or torch
    from transformers import PreTrainedTokenizerBase

    from braid.runtime.models import ModelConfig


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer, PreTrainedConfig

    try:
        # AutoTokenizer reads the model's config only for its model type and tokenizer hints.
        # transformers' generic config class holds them; the architecture's own config class
        # (what AutoTokenizer loads when given none) imports most of transformers.
        config = PreTrainedConfig.from_dict(_tokenizer_fields(path / "config.json"))
        tokenizer = AutoTokenizer.from_pretrained(path, config=config)
        check_chat_template(tokenizer)
        return tokenizer
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"cannot load the tokenizer in {path}: {e}") from None


def _tokenizer_fields(config_json: Path) -> dict:
    """A config.json's fields less its rope settings: a tokenizer needs none, and transformers
    5's generic config class fails on a v4 `rope_scaling` of type longrope, llama3 or yarn
    (Phi-3-128k, Llama 3.1), whose standardization reads a max_position_embeddings that the
    generic class does not hold."""
    fields = json.loads(config_json.read_text())
    if isinstance(fields, dict):  # anything else is refused by from_dict, as before
        for key in ("rope_scaling", "rope_parameters"):
            fields.pop(key, None)
    return fields


def check_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse, at load, a chat template that runs past its bounds (runtime/text/template_render.py)
    on a one-message conversation: one that loops without end would otherwise be met by
    every chat request."""
    if getattr(tokenizer, "chat_template", None) is None:
        return
    try:
        template_render.render(
            tokenizer, [{"role": "user", "content": "Hello"}], add_generation_prompt=True
        )
    except template_render.TemplateLimitError:
        raise
    except Exception:  # it refuses this conversation (a role it wants first...): others may do
        pass


def adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether `tokenizer.encode` puts a BOS token before the text."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer.encode("a")[:1] == [bos]


def eos_token_ids(path: Path, config: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """EOS ids from the model config, generation_config.json (Llama 3 lists several) and the
    tokenizer: any of them ends a request."""
    from transformers import GenerationConfig

    ids = set(config.eos_token_ids)
    if (path / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids |= {eos} if isinstance(eos, int) else set(eos or ())
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
