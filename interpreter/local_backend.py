"""LocalBackend: programs run on an in-process Engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

import msgspec

from braid.interpreter.streamed_text import PieceBuffer
from braid.interpreter.thoughts import split_thought
from braid.runtime.protocol import GenerateOutput, SamplingParams
from braid.runtime.text.chat_template import ChatTemplate
from braid.runtime.text.generation_openings import GenerationOpenings

if TYPE_CHECKING:  # the engine (and torch) load only when a LocalBackend is made
    from braid.runtime.engine.engine import Engine
    from braid.runtime.text.reasoning import ReasoningFormat


class LocalBackend:
    heals_prompts = True  # the engine heals (Engine.heal)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def start(cls, model: str | None = None, **engine_config: Any) -> LocalBackend:
        """A LocalBackend on a new `Engine(model, **engine_config)` (the default model if
        None); the engine, and torch, load here."""
        from braid.runtime.engine.engine import Engine

        return cls(Engine(model=model, **engine_config))

    @cached_property
    def chat_template(self) -> ChatTemplate:
        return ChatTemplate.from_tokenizer(self.engine.tokenizer)

    @cached_property
    def generation_openings(self) -> GenerationOpenings | None:
        return GenerationOpenings.from_tokenizer(self.engine.tokenizer)

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        """The engine's (EngineConfig.reasoning_format, detected from the model by default)."""
        return self.engine.reasoning_format

    async def generate(
        self,
        prompt: str,
        params: SamplingParams,
        on_text: Callable[[str], None],
        lora: str | None = None,
        program: str | None = None,
    ) -> GenerateOutput:
        text, token_ids = [], []
        pieces = PieceBuffer(params.wants_logprobs)
        async for chunk in self.engine.stream(prompt, params, lora=lora, program=program):
            piece = pieces.add(chunk.text, chunk.token_ids, chunk.logprobs, chunk.top_logprobs)
            if piece is not None:
                on_text(piece)
            text.append(chunk.text)
            token_ids += chunk.token_ids
        if chunk.error:
            raise RuntimeError(chunk.error)
        meta = chunk.meta or {}
        if params.prompt_logprobs_from is not None:  # which tokens those logprobs are of
            meta["prompt_token_ids"] = self.engine.encode(prompt)[params.prompt_logprobs_from :]
        if params.reasoning:
            meta |= self._split_thought(prompt, "".join(text))
        return GenerateOutput("".join(text), token_ids, chunk.finish_reason, meta)

    def _split_thought(self, prompt: str, text: str) -> dict[str, str]:
        """The output's thought and answer, split in the engine's reasoning format from where
        the prompt's tokens leave the model."""
        from braid.runtime.text.reasoning import prompt_opening  # transformers: local only

        fmt = self.engine.reasoning_format
        opening = prompt_opening(fmt, self.engine.tokenizer, self.engine.encode(prompt))
        return split_thought(fmt, opening, text)

    def compile_ahead(self, params: SamplingParams) -> None:
        """Start compiling the params' constraint (its gen finds it in the compile cache)."""
        self.engine.prepare(params)

    async def release_program(self, program: str, lora: str | None = None) -> None:
        """Program state `program` will not continue: the engine drops its lease."""
        self.engine.release_program(program, lora=lora)

    async def score(
        self, prefix: str, continuations: list[str], lora: str | None = None
    ) -> list[list[float]]:
        return await self.engine.ascore(prefix, continuations, lora=lora)

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """Each token's own text."""
        return [self.engine.tokenizer.decode([t]) for t in token_ids]

    def token_pieces(self, prompt: str, token_ids: list[int], healed: str = "") -> list[str]:
        """The text each output token added after `prompt`, as the engine streamed it (a
        token that ends inside a character adds "", the next one the character; `healed`:
        the prompt's last token, which token healing took off and the output spells again)."""
        from braid.runtime.output.detokenizer import (
            IncrementalDetokenizer,  # transformers: local only
        )

        ids = self.engine.encode(prompt)
        if healed:
            ids = ids[:-1]
        detokenizer = IncrementalDetokenizer(self.engine.tokenizer, ids, given=healed)
        return [detokenizer.add([t]) for t in token_ids]

    def prompt_chars(self, prompt: str, num_tokens: int) -> int:
        """How many characters of `prompt` its first num_tokens tokens spell."""
        if num_tokens <= 0:
            return 0
        encoded = self.engine.tokenizer(prompt, return_offsets_mapping=True)
        return encoded["offset_mapping"][num_tokens - 1][1]

    def flush_cache(self) -> None:
        """Drop the engine's cached prefixes."""
        self.engine.flush_cache()

    def get_server_info(self) -> dict:
        """The engine's configuration and counters (what a braid server's /get_server_info
        reports of its engine)."""
        config = msgspec.to_builtins(dataclasses.asdict(self.engine.config))
        return {
            **config,
            "context_length": self.engine.context_length,
            "stats": self.engine.stats(),
        }
