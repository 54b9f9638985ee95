"""Every backend implements the whole Backend protocol (so no caller probes for a member),
and a backend that cannot do a thing answers as the protocol's contract says."""

from __future__ import annotations

import asyncio
import inspect

import pytest

import braid as sgl
from braid.interpreter import (
    Backend,
    ChatTemplate,
    LocalBackend,
    OpenAIBackend,
    RayBackend,
    RemoteBackend,
)
from braid.runtime.protocol import SamplingParams

BACKENDS = (LocalBackend, RemoteBackend, OpenAIBackend, RayBackend)
METHODS = sorted(
    name for name, value in vars(Backend).items() if inspect.isfunction(value) and name[0] != "_"
)


def _parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_protocol_declares_what_the_interpreter_and_frontend_use():
    assert "chat_template" in vars(Backend)
    assert set(METHODS) == {
        "generate",
        "score",
        "compile_ahead",
        "release_program",
        "token_texts",
        "token_pieces",
        "prompt_chars",
        "flush_cache",
        "get_server_info",
    }


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("name", METHODS)
def test_every_backend_implements_every_member_as_declared(backend, name):
    declared = vars(Backend)[name]
    implemented = getattr(backend, name)
    assert _parameters(implemented) == _parameters(declared)
    assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared)


def test_each_backend_says_whether_it_heals_prompts():
    assert "heals_prompts" in vars(Backend)
    heals = {b: b.heals_prompts for b in BACKENDS}
    assert heals == {
        LocalBackend: True,
        RemoteBackend: True,
        OpenAIBackend: False,
        RayBackend: True,
    }


@pytest.mark.parametrize("backend", (LocalBackend, RemoteBackend, RayBackend))
def test_the_chat_template_is_a_member_of_the_class(backend):
    assert "chat_template" in vars(backend)  # OpenAIBackend's is set by its constructor


def test_an_openai_backend_says_what_it_cannot_do():
    # Nothing here reaches the endpoint: each answer is the backend's own.
    backend = OpenAIBackend("http://127.0.0.1:9/v1", model="m")
    assert isinstance(backend.chat_template, ChatTemplate)
    params = SamplingParams(regex="[0-9]+")
    assert backend.compile_ahead(params) is None
    assert asyncio.run(backend.release_program("state", lora="sql")) is None
    assert backend.token_texts([5, 7]) == [None, None]
    assert backend.token_pieces("prompt", [5, 7]) is None
    assert backend.prompt_chars("prompt", 1) is None
    with pytest.raises(NotImplementedError, match="OpenAIBackend cannot flush_cache"):
        sgl.flush_cache(backend)
    with pytest.raises(NotImplementedError, match="OpenAIBackend cannot get_server_info"):
        sgl.get_server_info(backend)
