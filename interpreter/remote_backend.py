"""RemoteBackend: programs run on a braid server (`braid serve`).

Gens stream through the native /generate; selects go to /braid/score, where the server's
engine aligns and scores the choices exactly as a local engine does; roles render with the
chat template the server reports in /get_model_info. So a program gives the same results as
with a LocalBackend on the same model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

from braid.interpreter.event_loop import interpreter_loop as loop
from braid.interpreter.http import HttpClient
from braid.interpreter.streamed_text import PieceBuffer
from braid.interpreter.thoughts import split_thought
from braid.runtime.protocol import GenerateOutput, SamplingParams, wire_sampling
from braid.runtime.text import reasoning
from braid.runtime.text.chat_template import ChatTemplate

if TYPE_CHECKING:
    from braid.runtime.text.generation_openings import GenerationOpenings
    from braid.runtime.text.reasoning import ReasoningFormat

log = logging.getLogger(__name__)


class RemoteBackend:
    heals_prompts = True  # token_healing travels in /generate's sampling_params

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout: float = 600.0,
        cache_salt: str | None = None,
    ) -> None:
        """`cache_salt`: the server's prefix cache shares this backend's prompts only with
        requests that give the same salt (forks of a program still share theirs)."""
        self.http = HttpClient(url, api_key, timeout)
        # Sent with every request that runs the model, only when set: a server older than
        # the field refuses it, even null.
        self._salt = {"cache_salt": cache_salt} if cache_salt is not None else {}
        self.model_info = self.http.get_sync("/get_model_info")
        # Token id -> text, as the server named them in the logprobs it reported.
        self._token_texts: dict[int, str] = {}

    @cached_property
    def chat_template(self) -> ChatTemplate:
        markers = self.model_info.get("chat_template")
        if markers is None:
            raise ValueError(
                f"the model served at {self.http.base_url} has no chat template, so "
                "system/user/assistant roles cannot be rendered; write the prompt text yourself"
            )
        return ChatTemplate(**markers)

    @cached_property
    def generation_openings(self) -> GenerationOpenings | None:
        """How the template's generation prompt opens an assistant message, as the server
        reports it (None from a server that does not)."""
        from braid.runtime.text.generation_openings import GenerationOpenings

        fields = self.model_info.get("generation_openings")
        return None if fields is None else GenerationOpenings.from_wire(fields)

    @cached_property
    def reasoning_format(self) -> ReasoningFormat | None:
        """The served model's reasoning format (None: it does not think)."""
        if "reasoning_format" not in self.model_info:
            raise NotImplementedError(
                f"RemoteBackend cannot run a reasoning gen: the server at {self.http.base_url} "
                "does not report its model's reasoning format in /get_model_info (an older braid)"
            )
        fields = self.model_info["reasoning_format"]
        return None if fields is None else reasoning.from_wire(fields)

    async def generate(
        self,
        prompt: str,
        params: SamplingParams,
        on_text: Callable[[str], None],
        lora: str | None = None,
        program: str | None = None,
    ) -> GenerateOutput:
        # What is reported goes in /generate's own fields (return_logprob, top_logprobs_num,
        # logprob_start_len).
        prompt_from = params.prompt_logprobs_from
        body = {
            "text": prompt,
            "sampling_params": wire_sampling(params),
            "stream": True,
            "return_logprob": params.wants_logprobs or prompt_from is not None,
            "top_logprobs_num": params.top_logprobs,
            "return_text_in_logprobs": True,
            **self._salt,
            **_lora(lora),
        }
        if program is not None:
            body["program_id"] = program
        if prompt_from is not None:
            body["logprob_start_len"] = prompt_from
        last, seen, ids_seen = None, 0, 0
        listing, tops = [], []  # output logprobs, from every event that reports some
        pieces = PieceBuffer(params.wants_logprobs)
        async for last in self.http.events("/generate", body):
            text, ids = last["text"], last["output_ids"]  # all of them so far
            new_listing = last["meta_info"].get("output_token_logprobs") or []
            new_tops = last["meta_info"].get("output_top_logprobs") or []
            lps = [lp for lp, _, _ in new_listing]
            step_tops = [{t: lp for lp, t, _ in step} for step in new_tops] or None
            piece = pieces.add(text[seen:], ids[ids_seen:], lps, step_tops)
            if piece is not None:
                on_text(piece)
            seen, ids_seen = len(text), len(ids)
            listing += new_listing
            tops += new_tops
        if last is None:
            raise RuntimeError(f"{self.http.base_url}/generate ended without a result")
        info = last["meta_info"]
        meta = {k: info[k] for k in ("prompt_tokens", "cached_tokens", "completion_tokens")}
        meta["preemptions"] = info.get("preemptions", 0)
        if params.wants_logprobs:
            self._learn_texts(listing, *tops)
            if tops and not listing:  # max_tokens=0: the top tokens after the prompt
                meta["next_top_logprobs"] = {t: lp for lp, t, _ in tops[0]}
                tops = []
            meta["logprobs"] = [lp for lp, _, _ in listing]
            tops = tops or [[] for _ in listing]
            meta["top_logprobs"] = [{t: lp for lp, t, _ in step} for step in tops]
        if prompt_from is not None:
            prompt_listing = info.get("input_token_logprobs") or []
            meta["prompt_logprobs"] = [lp for lp, _, _ in prompt_listing]
            meta["prompt_token_ids"] = [t for _, t, _ in prompt_listing]
            self._learn_texts(prompt_listing)
        if "reasoning_tokens" in info:
            meta["reasoning_tokens"] = info["reasoning_tokens"]
        if params.reasoning:  # the prompt's text ends as its tokens do: markers written out
            fmt = self.reasoning_format
            meta |= split_thought(fmt, fmt.opening(prompt[-200:]), last["text"])
        reason = info["finish_reason"]["type"]
        return GenerateOutput(last["text"], last["output_ids"], reason, meta)

    def compile_ahead(self, params: SamplingParams) -> None:
        """Have the server compile the params' constraint now (returns at once; a bad one
        fails its gen when it runs, as without this)."""
        body = {"sampling_params": wire_sampling(params)}
        asyncio.run_coroutine_threadsafe(_quietly(self.http.post("/braid/prepare", body)), loop())

    async def release_program(self, program: str, lora: str | None = None) -> None:
        """Program state `program` will not continue: the server drops its lease."""
        body = {"program_id": program, **self._salt, **_lora(lora)}
        await _quietly(self.http.post("/braid/release", body))

    async def score(
        self, prefix: str, continuations: list[str], lora: str | None = None
    ) -> list[list[float]]:
        body = {"prefix": prefix, "continuations": continuations, **self._salt, **_lora(lora)}
        return (await self.http.post("/braid/score", body))["logprobs"]

    def token_texts(self, token_ids: list[int]) -> list[str | None]:
        """Each token's text, as the server named it in reported logprobs (None if it never
        did)."""
        return [self._token_texts.get(t) for t in token_ids]

    def token_pieces(self, prompt: str, token_ids: list[int], healed: str = "") -> list[str] | None:
        """Not available: the server streams text, not each token's piece of it."""
        return None

    def prompt_chars(self, prompt: str, num_tokens: int) -> int | None:
        """Not available: the server's tokenizer is not at hand."""
        return None

    def cache_prefix(self, prefix: str) -> None:
        """Have the server compute `prefix` now and keep it in its prefix cache, so that the
        prompts that start with it find it there (SGLang's RuntimeEndpoint.cache_prefix: a
        /generate of no tokens). It stays while the cache has room, as any prefix does."""
        body = {"text": prefix, "sampling_params": {"max_new_tokens": 0}, **self._salt}
        self.http.post_sync("/generate", body)

    def flush_cache(self) -> None:
        """Drop the server's cached prefixes."""
        self.http.post_sync("/flush_cache", {})

    def get_server_info(self) -> dict:
        """The server's /get_server_info."""
        return self.http.get_sync("/get_server_info")

    def _learn_texts(self, *listings: list[list]) -> None:
        for listing in listings:
            self._token_texts.update((t, text) for _, t, text in listing if text is not None)


async def _quietly(call) -> None:
    """Await a call whose failure changes nothing the program sees (an ahead-of-time compile,
    a lease's release: without them the server does the work later, or lets it expire)."""
    try:
        await call
    except Exception:
        log.debug("braid server call failed; going on without it", exc_info=True)


def _lora(name: str | None) -> dict[str, str]:
    """The adapter field, only when set (a server older than it refuses it, even null)."""
    return {"lora_path": name} if name is not None else {}
