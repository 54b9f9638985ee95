"""How a chat template opens an assistant message that the model is to write: the text its
generation prompt adds (`add_generation_prompt=True`), which on a model that thinks is not the
opening of an assistant turn in a rendered history.

Qwen3 renders the last assistant turn of a history after an empty thought
(`<think>\\n\\n</think>\\n\\n`: thinking off) while its generation prompt leaves the model free
to think; DeepSeek-R1's generation prompt opens the thought (`<think>\\n`) where its history
turns have none; GPT-OSS's history turn is a `final` message, its generation prompt leaves
the channel to the model. So a program's assistant message opens as a history turn where
the program writes its first text (a few-shot answer: runtime/text/chat_template.py cuts that
opening) and as the generation prompt where the model does (a gen: this module). `thinking`
renders the generation prompt with the template's `enable_thinking` set (Qwen3 and SmolLM3
read it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from braid.runtime.text import template_render
from braid.runtime.text.template_render import TemplateLimitError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Conversations an assistant message can follow in any template we know of (as
# runtime/text/chat_template.py tries them), the first the template renders being used.
_BEFORE = (
    [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "user", "content": "a"}],
)


# The thinking settings' names on the wire.
_WIRE: dict[bool | None, str] = {None: "default", True: "thinking", False: "no_thinking"}


@dataclass(frozen=True)
class GenerationOpenings:
    """The generation prompt after a user message, by thinking setting: None as the template
    writes it by default, True/False with `enable_thinking` set so. False is absent where it
    renders as the default (the template has no switch that turns thinking off there)."""

    by_thinking: dict[bool | None, str]

    def opening(self, thinking: bool | None) -> str:
        """The opening for `thinking`; ValueError where the template cannot give it."""
        if thinking not in self.by_thinking:
            raise ValueError(
                f"assistant(thinking={thinking}): the model's chat template has no switch for "
                f"it (enable_thinking={thinking} renders its generation prompt as the default "
                "does); a gen's reasoning=0 closes the thought at once instead"
            )
        return self.by_thinking[thinking]

    def to_wire(self) -> dict[str, str]:
        """As /get_model_info reports them (RemoteBackend reads them back)."""
        return {_WIRE[t]: text for t, text in self.by_thinking.items()}

    @classmethod
    def from_wire(cls, fields: dict[str, str]) -> GenerationOpenings:
        by_name = {name: t for t, name in _WIRE.items()}
        return cls({by_name[name]: text for name, text in fields.items()})

    @classmethod
    def from_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> GenerationOpenings | None:
        """The tokenizer's template's generation prompts; None where it has no template or
        renders none after a user message."""
        if getattr(tokenizer, "chat_template", None) is None:
            return None
        for before in _BEFORE:
            by_thinking = {t: _generation_prompt(tokenizer, before, t) for t in (None, True, False)}
            if by_thinking[None] is None:
                continue
            if by_thinking[False] == by_thinking[None]:
                by_thinking.pop(False)
            return cls({t: text for t, text in by_thinking.items() if text is not None})
        return None


def _generation_prompt(
    tokenizer: PreTrainedTokenizerBase, before: list[dict], thinking: bool | None
) -> str | None:
    """What the generation prompt adds after `before`, rendered with enable_thinking set to
    `thinking` (None: not set); None where the template refuses or writes no suffix."""
    variables = None if thinking is None else {"enable_thinking": thinking}
    try:
        head = template_render.render(tokenizer, before, variables=variables)
        full = template_render.render(
            tokenizer, before, add_generation_prompt=True, variables=variables
        )
    except TemplateLimitError:  # past its bounds: not a refusal of this conversation
        raise
    except Exception:  # a template may refuse an order of roles: the caller tries another
        return None
    return full[len(head) :] if full.startswith(head) else None
