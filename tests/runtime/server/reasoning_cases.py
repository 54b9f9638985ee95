"""What the reasoning server tests share: the scripted reasoning models of
tests/reasoning_models.py served live (one server per script, built once a session), the
schema their answer follows, the tools their calls name, and the params the engine is given.

A script is written greedily wherever no mask forbids it: Qwen3's opens its own thought, R1's
prompt opens it, GPT-OSS's writes an analysis message and then (after the final header the
engine forces under a schema) falls back on its runner-up to start the JSON answer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import anthropic
import openai
import pytest
import transformers
from conftest import LiveServer
from reasoning_models import QUESTION, family_tokenizer, prompt_ids, scripted_model

from braid.runtime import Engine
from braid.runtime.loading.default_model import default_model_dir
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.service import Service

THOUGHT = "I should say yes."
ANSWER = '{"answer":true}'  # compact: braid's JSON grammar writes no whitespace (issue 61)
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "boolean"}},
    "required": ["answer"],
    "additionalProperties": False,
}
CHAT_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
WEATHER = {
    "type": "function",
    "function": {"name": "weather", "description": "The forecast.", "parameters": NO_ARGUMENTS},
}
CALL_THOUGHT = "Checking the forecast."
LAST = "the prompt's last token"  # a runner-up's key: after the prompt (and the same token)


class Scripted(NamedTuple):
    family: str
    text: str
    template_kwargs: dict = {}
    also: dict | None = None  # token -> (runner-up, weight), as scripted_model takes it
    engine_options: dict = {}


SERVED = {
    "qwen3": Scripted("qwen3", f"<think>{THOUGHT}</think>{ANSWER}"),
    "r1": Scripted("r1", f"{THOUGHT}</think>{ANSWER}"),
    # After the forced final header, <|message|>'s successor ("I") is not JSON: the runner-up.
    "gpt_oss": Scripted(
        "gpt_oss",
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|>{ANSWER}",
        also={"<|message|>": ('{"', 0.5)},
    ),
    # The prompt says thinking is off (enable_thinking false): the answer comes at once.
    "qwen3_off": Scripted("qwen3", ANSWER, {"enable_thinking": False}),
    "qwen3_tool": Scripted(
        "qwen3",
        f'<think>{CALL_THOUGHT}</think><tool_call>{{"name":"weather","arguments":{{}}}}'
        "</tool_call>",
    ),
    # After the forced turn start (which ends as the prompt does), a call's " to" where
    # the grammar allows no other channel.
    "gpt_oss_tool": Scripted(
        "gpt_oss", f"<|channel|>analysis<|message|>{CALL_THOUGHT}<|end|>", also={LAST: (" to", 0.5)}
    ),
    # Qwen3 served as a model without a reasoning format.
    "qwen3_plain": Scripted(
        "qwen3", f"<think>{THOUGHT}</think>{ANSWER}", engine_options={"reasoning_format": "none"}
    ),
}


class Served(NamedTuple):
    live: LiveServer
    engine: Engine
    tokenizer: Any
    prompt_ids: list[int]  # QUESTION's generation prompt, with the script's template kwargs

    @property
    def url(self) -> str:
        return self.live.url

    @property
    def service(self) -> Service:
        return self.live.server.config.app.state.service

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="unused", max_retries=0)

    def tokens(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """serve(name): SERVED[name]'s model behind a live server (one a session per name)."""
    running: dict[str, Served] = {}

    def serve(name: str) -> Served:
        if name not in running:
            s = SERVED[name]
            directory = tmp_path_factory.mktemp(f"{s.family}-tokenizer")
            family_tokenizer(s.family, default_model_dir(), directory)
            tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
            prompt = prompt_ids(tokenizer, QUESTION, **s.template_kwargs)
            also = {prompt[-1] if k == LAST else k: v for k, v in (s.also or {}).items()}
            path = scripted_model(
                tmp_path_factory.mktemp(name), s.family, prompt, s.text, also or None
            )
            engine = Engine(
                model=str(path),
                device="cpu",
                dtype="float32",
                max_kv_tokens=2048,
                **s.engine_options,
            )
            running[name] = Served(LiveServer(engine), engine, tokenizer, prompt)
        return running[name]

    yield serve
    for s in running.values():
        s.live.stop()
        s.engine.shutdown()


def given_params(monkeypatch, served: Served) -> list[SamplingParams]:
    """The params each request the server takes from now on hands the engine (as the
    pipeline compiles them), appended as they come."""
    given: list[SamplingParams] = []
    service = served.service
    check = service.check_params

    async def recorded(params: SamplingParams, request) -> None:
        given.append(params)
        await check(params, request)

    monkeypatch.setattr(service, "check_params", recorded)
    return given
