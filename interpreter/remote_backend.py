"""RemoteBackend: programs run on a braid server (`braid serve`).

Gens stream through the native /generate; selects go to /braid/score, where the server's
engine aligns and scores the choices exactly as a local engine does; roles render with the
chat template the server reports in /get_model_info. So a program gives the same results as
with a LocalBackend on the same model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import msgspec

from braid.interpreter.http import HttpClient
from braid.runtime.chat_template import ChatTemplate
from braid.runtime.outputs import GenerateOutput
from braid.runtime.sampling_params import SamplingParams
from braid.runtime.server.wire import SAMPLING_FIELDS


class RemoteBackend:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.http = HttpClient(url, api_key, timeout)
        self.model_info = self.http.get_sync("/get_model_info")

    @cached_property
    def chat_template(self) -> ChatTemplate:
        markers = self.model_info.get("chat_template")
        if markers is None:
            raise ValueError(
                f"the model served at {self.http.base_url} has no chat template, so "
                "system/user/assistant roles cannot be rendered; write the prompt text yourself"
            )
        return ChatTemplate(**markers)

    async def generate(
        self, prompt: str, params: SamplingParams, on_text: Callable[[str], None]
    ) -> GenerateOutput:
        # What is reported goes in /generate's own fields (return_logprob, top_logprobs_num).
        sampling = {k: v for k, v in msgspec.to_builtins(params).items() if k in SAMPLING_FIELDS}
        body = {
            "text": prompt,
            "sampling_params": sampling,
            "stream": True,
            "return_logprob": params.wants_logprobs,
            "top_logprobs_num": params.top_logprobs,
        }
        last, seen = None, 0
        async for last in self.http.events("/generate", body):
            text = last["text"]  # all of it so far
            if len(text) > seen:
                on_text(text[seen:])
                seen = len(text)
        if last is None:
            raise RuntimeError(f"{self.http.base_url}/generate ended without a result")
        info = last["meta_info"]
        meta = {k: info[k] for k in ("prompt_tokens", "cached_tokens", "completion_tokens")}
        meta["preemptions"] = info.get("preemptions", 0)
        if params.wants_logprobs:
            meta["logprobs"] = [lp for lp, _, _ in info["output_token_logprobs"]]
            tops = info.get("output_top_logprobs") or [[] for _ in meta["logprobs"]]
            meta["top_logprobs"] = [{t: lp for lp, t, _ in step} for step in tops]
        reason = info["finish_reason"]["type"]
        return GenerateOutput(last["text"], last["output_ids"], reason, meta)

    async def score(self, prefix: str, continuations: list[str]) -> list[list[float]]:
        body = {"prefix": prefix, "continuations": continuations}
        return (await self.http.post("/braid/score", body))["logprobs"]
