"""OpenAIBackend against braid's own OpenAI routes: the same results as a local engine where
the API can express the program, and clear errors where it cannot."""

from __future__ import annotations

import re

import pytest

from braid import assistant, gen, program, select, system, user
from braid.interpreter import ChatTemplate, LocalBackend, OpenAIBackend

GREEDY = {"temperature": 0}
UNHEALED = {**GREEDY, "token_healing": False}  # as an OpenAI API runs a gen: it cannot heal


@pytest.fixture(scope="module")
def local(engine):
    return LocalBackend(engine)


@pytest.fixture(scope="module")
def remote(server):
    return OpenAIBackend(server.url + "/v1", model="tiny", api_key="unused")


@program
def story(s):
    s += "A story about a fox:"
    s += gen("story", max_tokens=12, stop=" the")
    s += " The end. Moral:"
    s += select("moral", [" be kind", " be quick", " never trust a fox"])


@program
def chat(s):
    s += system("Be brief.")
    s += user("Hi there")
    s += assistant(gen("reply", max_tokens=8))
    s += user("Again")
    s += assistant(gen("again", max_tokens=8, return_logprobs=True))


def test_text_gen_and_select_as_locally(local, remote):
    here = story.run(backend=local, sampling=UNHEALED)
    there = story.run(backend=remote, sampling=GREEDY)
    assert there.text() == here.text()
    assert there["moral"] == here["moral"]
    for a, b in zip(there.meta("moral")["logprobs"], here.meta("moral")["logprobs"], strict=True):
        assert a == pytest.approx(b, abs=1e-4)


def test_chat_roles_through_the_chat_api(local, remote):
    here = chat.run(backend=local, sampling=GREEDY)
    there = chat.run(backend=remote, sampling=GREEDY)
    assert there["reply"] == here["reply"] and there["again"] == here["again"]
    assert there.messages() == here.messages()
    assert len(there.meta("again")["logprobs"]) == there.meta("again")["completion_tokens"]


def test_constraints_as_the_endpoints_fields(remote):
    @program
    def p(s):
        s += "Code: "
        s += gen("code", regex=r"[A-Z]{3}-[0-9]{2}", max_tokens=10)
        s += " Age: "
        s += gen("age", dtype=int, max_tokens=4)

    state = p.run(backend=remote, sampling={"temperature": 0.7, "seed": 1})
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", state["code"]) and isinstance(state["age"], int)


def test_select_in_roles_needs_the_template(engine, local, server, remote):
    @program
    def p(s):
        s += user("Hi!")
        s += assistant(select("greeting", ["Hello", "Goodbye"]))

    with pytest.raises(ValueError, match="chat_template"):
        p.run(backend=remote)
    templated = OpenAIBackend(
        server.url + "/v1", "tiny", chat_template=ChatTemplate.from_tokenizer(engine.tokenizer)
    )
    assert p.run(backend=templated)["greeting"] == p.run(backend=local)["greeting"]


def test_gen_in_the_middle_of_an_assistant_message_is_refused(remote):
    @program
    def p(s):
        s += user("Hi!")
        with s.assistant():
            s += "Well, "
            s += gen("x", max_tokens=3)

    with pytest.raises(ValueError, match="start of an assistant message"):
        p.run(backend=remote)


def test_an_endpoint_without_prompt_logprobs_says_so(server):
    nowhere = OpenAIBackend(server.url + "/nowhere", "tiny")

    @program
    def p(s):
        s += "Pick:"
        s += select("x", [" a", " b"])

    with pytest.raises(RuntimeError, match="select needs prompt logprobs"):
        p.run(backend=nowhere)
