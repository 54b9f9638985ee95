"""What each backend tells the interpreter about a model that thinks: its reasoning format
and its template's generation prompts (LocalBackend's from its engine and tokenizer, against
transformers' rendering), and what a backend that cannot tell does with a reasoning gen."""

from __future__ import annotations

import asyncio
import functools

import pytest
import transformers
from reasoning_models import FAMILIES, family_tokenizer, render

from braid import OpenAIBackend, gen, program
from braid.interpreter import Backend, LocalBackend, RayBackend, RemoteBackend
from braid.runtime import Engine, SamplingParams
from braid.runtime.text.generation_openings import GenerationOpenings
from braid.runtime.text.reasoning import detect

BACKENDS = (LocalBackend, RemoteBackend, OpenAIBackend, RayBackend)


@pytest.mark.parametrize("member", ["reasoning_format", "generation_openings"])
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
def test_every_backend_has_the_reasoning_members(backend, member):
    assert isinstance(vars(Backend)[member], property)
    # A member of the class (not probed for on an instance), read as an attribute.
    assert isinstance(getattr(backend, member), property | functools.cached_property)


CONVERSATION = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_openings_are_what_the_generation_prompt_adds(
    tmp_path, default_model_path, family
):
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        family_tokenizer(family, default_model_path, tmp_path)
    )
    openings = GenerationOpenings.from_tokenizer(tokenizer)
    for thinking in (None, True, False):
        kwargs = {} if thinking is None else {"enable_thinking": thinking}
        head = render(tokenizer, CONVERSATION, **kwargs)
        full = render(tokenizer, CONVERSATION, add_generation_prompt=True, **kwargs)
        if thinking is False and family in ("r1", "gpt_oss"):  # their templates lack the switch
            assert full.removeprefix(head) == openings.opening(None)
            with pytest.raises(ValueError, match="has no switch"):
                openings.opening(False)
        else:
            assert openings.opening(thinking) == full.removeprefix(head)


def test_a_local_backend_tells_its_engines_format_and_splits_its_outputs(tiny_model_path):
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=1024,
        reasoning_format="think",
    )
    try:
        backend = LocalBackend(engine)
        assert backend.reasoning_format == detect(engine.tokenizer, None, "think")
        params = SamplingParams(
            reasoning=True,
            thinking_budget=3,
            thinking_budget_mode="hard",
            max_tokens=16,
            temperature=0,
        )
        out = asyncio.run(backend.generate("Q: Why?\nA: <think>", params, lambda text: None))
    finally:
        engine.shutdown()
    # The prompt opened the thought; the budget forced its end: the text keeps the marker,
    # the split drops it and the whitespace around it.
    thought, end, answer = out.text.partition("</think>")
    assert end and out.meta["reasoning_content"] == thought.strip()
    assert out.meta["content"] == answer.lstrip()


def test_a_backend_that_cannot_tell_the_format_refuses_a_reasoning_gen():
    @program
    def thinks(s):
        s += "Q: Why?\nA:" + gen("answer", reasoning=True)

    backend = OpenAIBackend("http://127.0.0.1:9/v1", model="m")  # nothing is sent
    assert backend.generation_openings is None
    with pytest.raises(NotImplementedError, match="OpenAIBackend cannot run a reasoning gen"):
        thinks.run(backend=backend)


def test_a_remote_backend_reads_what_the_server_reports(server, engine):
    backend = RemoteBackend(server.url)
    local = LocalBackend(engine)
    assert backend.reasoning_format is local.reasoning_format is None  # the tiny model's
    assert backend.generation_openings == local.generation_openings
