"""A model's chat template as the text it puts around each message.

Programs build messages piece by piece (a gen can sit in the middle of one), so the whole
conversation cannot be rendered at once. Instead the template is rendered on marker
messages and cut at the markers: what precedes a message's content is its opening, what
follows is its closing. A template that adds text of its own before a conversation that
does not start with a system message (SmolLM2 adds a default system prompt) gives a
different opening for a first message of that role; both are kept, so `state.text()` equals
`tokenizer.apply_chat_template(state.messages())`.
"""

from __future__ import annotations

from dataclasses import dataclass

from braid.runtime.text import template_render
from braid.runtime.text.template_render import TemplateLimitError
from braid.runtime.text.tokenizer import adds_bos

# The roles a program can write messages in.
ROLES = ("system", "user", "assistant")

_MARK = "\x00braid-marker-{}\x00"
# Conversations a message of each role can follow in any template we know of.
_BEFORE = {
    "system": ([("user", "a"), ("assistant", "b")],),
    "user": ([("system", "a")], [("user", "a"), ("assistant", "b")]),
    "assistant": ([("system", "a"), ("user", "b")], [("user", "a")]),
}


@dataclass(frozen=True)
class ChatTemplate:
    # role -> text before the content of a first message, of a later one, and after it; a
    # role the template refuses (some refuse system messages) is absent.
    first_opening: dict[str, str]
    opening: dict[str, str]
    closing: dict[str, str]

    def begin(self, role: str, first: bool) -> str:
        if role not in self.closing:
            raise ValueError(f"the model's chat template cannot render a {role} message")
        return (self.first_opening if first else self.opening)[role]

    def end(self, role: str) -> str:
        return self.closing[role]

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ChatTemplate:
        """Cut the tokenizer's chat template into per-role openings and closings."""
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the model's tokenizer has no chat template, so system/user/assistant roles "
                "cannot be rendered; write the prompt text yourself"
            )
        # The engine encodes text with the tokenizer's special tokens (a BOS where it adds
        # one), so a BOS the template writes as text would appear twice.
        bos, strip_bos = tokenizer.bos_token, adds_bos(tokenizer)

        def render(messages: list[tuple[str, str]]) -> str | None:
            try:
                text = template_render.render(
                    tokenizer, [{"role": r, "content": c} for r, c in messages]
                )
            except TemplateLimitError:  # past its bounds: no refusal of this order of roles
                raise
            except Exception:  # a template may refuse an order of roles: try another
                return None
            return text.removeprefix(bos) if strip_bos else text

        first_opening, opening, closing = {}, {}, {}
        for role in ROLES:
            cut = _cut(render, [], role)
            if cut is None:  # say so if a program uses the role
                continue
            first_opening[role], closing[role] = cut
            for before in _BEFORE[role]:
                cut = _cut(render, before, role)
                if cut is not None:
                    opening[role] = cut[0]
                    break
            else:
                opening[role] = first_opening[role]
        return cls(first_opening, opening, closing)


def _cut(render, before: list[tuple[str, str]], role: str) -> tuple[str, str] | None:
    """(opening, closing) of a `role` message that follows the conversation `before`."""
    before = [(r, _MARK.format(c)) for r, c in before]
    mark = _MARK.format("content")
    head, full = render(before) if before else "", render([*before, (role, mark)])
    if head is None or full is None or not full.startswith(head) or mark not in full:
        return None
    opening, _, closing = full[len(head) :].partition(mark)
    return opening, closing
