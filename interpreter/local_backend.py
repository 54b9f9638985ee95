"""LocalBackend: programs run on an in-process Engine."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

from interpreter.chat_template import ChatTemplate
from runtime.engine import Engine
from runtime.outputs import GenerateOutput
from runtime.radix_cache import common_prefix_length
from runtime.request_tree import TreeNode
from runtime.sampling_params import SamplingParams


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
        """One request tree: the tokens every continuation shares with the prefix are the
        root, computed once; each continuation's remaining tokens are a leaf asking only
        for their logprobs."""
        tokenizer = self.engine.tokenizer
        start_ids = self._document_start(prefix)
        prefix_ids = start_ids + tokenizer.encode(prefix)
        full = [start_ids + tokenizer.encode(prefix + c) for c in continuations]
        # Tokens at the boundary may merge ("Answer:" + " Paris" -> ":" " Paris" or
        # ": Paris"): everything from the first position where any continuation departs
        # from the prefix's tokens is scored, the same span of text for every choice.
        start = min(common_prefix_length(ids, prefix_ids) for ids in full)
        if start == 0:
            raise ValueError("select needs text before the choices to score them against")
        leaf = SamplingParams(max_tokens=0, prompt_logprobs_from=start)
        tree = TreeNode(full[0][:start], [TreeNode(ids[start:], params=leaf) for ids in full])
        outs = await self.engine.agenerate_tree(tree)
        return [out.meta["prompt_logprobs"] for out in outs]

    def _document_start(self, prefix: str) -> list[int]:
        """Scoring needs at least one token of context: with an empty prefix (an
        unconditional score) the document starts with BOS, or EOS where there is none."""
        if prefix:
            return []
        tokenizer = self.engine.tokenizer
        if tokenizer.encode("a")[:1] == [tokenizer.bos_token_id]:
            return []  # encode adds it
        start = tokenizer.bos_token_id
        return [start if start is not None else min(self.engine.eos_token_ids)]
