"""LocalBackend: programs run on an in-process Engine."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

from braid.runtime.chat_template import ChatTemplate
from braid.runtime.outputs import GenerateOutput
from braid.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine (and torch) load only when a LocalBackend is made
    from braid.runtime.engine import Engine


class LocalBackend:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @cached_property
    def chat_template(self) -> ChatTemplate:
        return ChatTemplate.from_tokenizer(self.engine.tokenizer)

    async def generate(
        self, prompt: str, params: SamplingParams, on_text: Callable[[str], None]
    ) -> GenerateOutput:
        text, token_ids = [], []
        async for chunk in self.engine.stream(prompt, params):
            if chunk.text:
                on_text(chunk.text)
            text.append(chunk.text)
            token_ids += chunk.token_ids
        if chunk.error:
            raise RuntimeError(chunk.error)
        return GenerateOutput("".join(text), token_ids, chunk.finish_reason, chunk.meta or {})

    async def score(self, prefix: str, continuations: list[str]) -> list[list[float]]:
        return await self.engine.ascore(prefix, continuations)
