"""A model's reasoning format: how its thoughts are marked, where a prompt leaves thinking,
and how an output splits into its thought and its answer.

Two formats exist among the models people run: think tags (`<think>...</think>`: Qwen3,
DeepSeek-R1 and its distills, SmolLM3, Phi-4-mini-reasoning) and harmony's channels (GPT-OSS:
an `analysis` message, then a `final` one, or `commentary` calls to functions). The format is
detected from the tokenizer's tokens and the chat template, or named (`--reasoning-format`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # a remote backend reads a format without loading transformers
    from transformers import PreTrainedTokenizerBase

FORMATS = ("auto", "none", "think", "harmony")

# Where a rendered prompt leaves the model: inside an open thought ("thinking"), past a closed
# or empty one ("off"), or at the start of its turn, free to open one or answer ("maybe").
Opening = Literal["thinking", "off", "maybe"]

_HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>")


# Harmony's headers before an answer: the final channel's, with a schema's constraint type.
_TURN = "<|start|>assistant"
_FINAL = "<|channel|>final<|message|>"
_FINAL_JSON = "<|channel|>final <|constrain|>json<|message|>"


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers of one model's thoughts, as text and as the token ids its tokenizer writes
    for them. `special`: the markers are special tokens, which the detokenizer keeps in a
    reasoning request's text so the output can be split."""

    kind: Literal["think", "harmony"]
    start: str
    end: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    special: bool

    def opening(self, prompt_tail: str) -> Opening:
        """Where a prompt whose text ends with `prompt_tail` (its last tokens decoded with
        their special tokens) leaves the model."""
        tail = prompt_tail.rstrip()
        if tail.endswith(self.start):
            return "thinking"
        if tail.endswith((self.end, _FINAL, _FINAL_JSON)):
            return "off"
        return "maybe"

    def headers(self, answer: Literal["text", "json", "calls"]) -> tuple[str, str]:
        """What stands before an answer held to a constraint: after the thought, and where
        the model answers without one. Nothing for think tags; harmony's final header
        (`<|constrain|>json` in it for a schema), or for calls the turn's start alone (the
        call grammar writes their headers, grammars/harmony_calls.py)."""
        if self.kind != "harmony":
            return "", ""
        if answer == "calls":
            return _TURN, ""
        final = _FINAL_JSON if answer == "json" else _FINAL
        return _TURN + final, final


def from_wire(fields: dict[str, Any]) -> ReasoningFormat:
    """A format as /get_model_info reports it (dataclasses.asdict of one)."""
    ids = {k: tuple(v) for k, v in fields.items() if k.endswith("_ids")}
    return ReasoningFormat(**{**fields, **ids})


def detect(
    tokenizer: PreTrainedTokenizerBase, template: str | None, name: str = "auto"
) -> ReasoningFormat | None:
    """The format `name` asks for ("auto": the one the tokenizer and template show, or None;
    "none": None). ValueError for a format the tokenizer cannot write."""
    if name not in FORMATS:
        raise ValueError(f"reasoning format must be one of {FORMATS}, got {name!r}")
    if name == "none":
        return None
    vocab = tokenizer.get_vocab()
    has_harmony = all(t in vocab for t in _HARMONY)
    if name == "harmony" or (name == "auto" and has_harmony):
        if not has_harmony:
            raise ValueError(f"reasoning format 'harmony': the tokenizer lacks {_HARMONY}")
        return _format(tokenizer, "harmony", "<|channel|>analysis<|message|>", "<|end|>")
    # Tags as tokens (Qwen3, DeepSeek-R1, SmolLM3) or as text the template writes (Phi-4-mini-
    # reasoning's are plain text).
    tags = ("<think>" in vocab and "</think>" in vocab) or "<think>" in (template or "")
    thinks = tags and "</think>" in (template or "")
    if name == "think" or (name == "auto" and thinks):
        return _format(tokenizer, "think", "<think>", "</think>")
    return None


def _format(tokenizer: PreTrainedTokenizerBase, kind, start: str, end: str) -> ReasoningFormat:
    start_ids, end_ids = encode(tokenizer, start), encode(tokenizer, end)
    added = tokenizer.added_tokens_decoder
    special = any(
        i in tokenizer.all_special_ids or (i in added and added[i].special)
        for i in start_ids + end_ids
    )
    return ReasoningFormat(kind, start, end, start_ids, end_ids, special)


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[int, ...]:
    """The ids of a marker's text (none for no text)."""
    return tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()


def prompt_opening(
    fmt: ReasoningFormat, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]
) -> Opening:
    """Where the prompt `prompt_ids` leaves the model (from its last tokens' text)."""
    tail = tokenizer.decode(prompt_ids[-32:], skip_special_tokens=False)
    return fmt.opening(tail)
