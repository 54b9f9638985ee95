"""Programs end to end on the tiny model, checked against the engine run directly,
transformers' logprobs and the tokenizer's chat template; engine counters prove sharing.
Each runs on a LocalBackend and on a RemoteBackend (a braid server on loopback)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Annotated, TypedDict

import jsonschema
import msgspec
import pytest
from conftest import LiveServer, assert_no_kv_leak, wait_idle

from braid import assistant, gen, program, select, system, user
from braid.interpreter import LocalBackend, RemoteBackend
from braid.runtime import Engine, SamplingParams

GREEDY = {"temperature": 0}
HEALED = {**GREEDY, "token_healing": True}  # as a program's gen after text samples


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    """A fresh engine for this module, so counter-based tests see only their requests."""
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=8192)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module", params=["local", "remote"])
def backend(request, engine):
    """Every program runs in-process and through a braid server on the same engine (so the
    engine's counters see both), with the same results."""
    if request.param == "local":
        yield LocalBackend(engine)
        return
    server = LiveServer(engine)
    yield RemoteBackend(server.url)
    server.stop()


def test_gen_continues_the_text_like_the_engine(engine, backend):
    @program
    def p(s, topic):
        s += f"A story about {topic}:"
        s += gen("story", max_tokens=12, stop=[" the"])

    state = p.run(topic="a fox", backend=backend, sampling=GREEDY)
    direct = engine.generate(  # a program's gen heals the prompt's end by default
        "A story about a fox:", SamplingParams(max_tokens=12, stop=[" the"], **HEALED)
    )
    assert state["story"] == direct.text
    assert state.text() == "A story about a fox:" + direct.text
    meta = state.meta("story")
    assert meta["finish_reason"] == direct.finish_reason
    assert meta["completion_tokens"] == len(direct.token_ids)


def test_roles_render_through_the_chat_template(engine, backend):
    @program
    def chat(s):
        s += system("Be brief.")
        s += user("Hi there")
        s += assistant(gen("reply", max_tokens=8))
        with s.user():
            s += "And "
            s += "then?"
        with s.assistant():
            s += gen("again", max_tokens=8)

    state = chat.run(backend=backend, sampling=GREEDY)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == state["reply"] and messages[3]["content"] == "And then?"
    assert state.text() == engine.tokenizer.apply_chat_template(messages, tokenize=False)
    # The reply was generated after the template's own generation prompt.
    first_turns = engine.tokenizer.apply_chat_template(
        messages[:2], tokenize=False, add_generation_prompt=True
    )
    direct = engine.generate(first_turns, SamplingParams(max_tokens=8, **GREEDY))
    assert state["reply"] == direct.text


@pytest.mark.parametrize("prefix", ["Answer:", "Answer: "])
def test_select_scores_each_choice_like_transformers(engine, backend, reference_logprobs, prefix):
    # With "Answer: " the trailing space merges into each choice's first token: the choices
    # must be scored from the ":" on, all of them over the same text (SGLang #1257, #2873).
    choices = ["Paris", " Paris", " London", " a very long and unlikely answer"]

    @program
    def p(s):
        s += prefix
        s += select("city", choices)

    state = p.run(backend=backend)
    tok = engine.tokenizer
    base = tok.encode("Answer:")
    full = [tok.encode(prefix + c) for c in choices]
    assert all(ids[: len(base)] == base for ids in full)
    start = min(len(base), *(_common(ids, tok.encode(prefix)) for ids in full))
    expected = [reference_logprobs(ids, start) for ids in full]
    got = state.meta("city")["logprobs"]
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=1e-4)
    means = [sum(e) / len(e) for e in expected]
    assert state["city"] == choices[means.index(max(means))]
    assert state.text() == prefix + state["city"]


def test_select_on_the_first_assistant_token(engine, backend, reference_logprobs):
    choices = ["Hello", "Goodbye", "^*B^&A"]

    @program
    def p(s, method):
        s += user("Hi!")
        s += assistant(select("greeting", choices, method=method))

    tok = engine.tokenizer
    head = tok.apply_chat_template(
        [{"role": "user", "content": "Hi!"}], tokenize=False, add_generation_prompt=True
    )
    head_ids = tok.encode(head)
    full = [tok.encode(head + c) for c in choices]
    assert all(ids[: len(head_ids)] == head_ids for ids in full)
    expected = [reference_logprobs(ids, len(head_ids)) for ids in full]
    state = p.run(method="token_length_normalized", backend=backend)
    assert state.meta("greeting")["logprobs"] == [pytest.approx(e, abs=1e-4) for e in expected]
    means = [sum(e) / len(e) for e in expected]
    assert state["greeting"] == choices[means.index(max(means))]
    # Greedy token selection: the best first token wins (no ties among these choices).
    firsts = [e[0] for e in expected]
    assert p.run(method="greedy", backend=backend)["greeting"] == choices[firsts.index(max(firsts))]
    # Unconditional: the prior comes from the assistant opening alone.
    opening = "<|im_start|>assistant\n"
    prior = [reference_logprobs(tok.encode(opening + c), len(tok.encode(opening))) for c in choices]
    gains = [(sum(e) - sum(u)) / len(e) for e, u in zip(expected, prior, strict=True)]
    state = p.run(method="unconditional_likelihood_normalized", backend=backend)
    assert state["greeting"] == choices[gains.index(max(gains))]
    assert state.meta("greeting")["scores"] == pytest.approx(gains, abs=1e-4)


def test_fork_prefills_the_shared_prefix_once(engine, backend):
    shared = "Shared context: " + " ".join(f"fact {i} is {i * 7}." for i in range(40))

    @program
    def p(s):
        s += shared
        forks = s.fork(4)
        for i, f in enumerate(forks):
            f += f" Branch {i} says"
            f += gen("x", max_tokens=4)
        s += " | ".join(f["x"] for f in forks)

    engine.flush_cache()
    before = engine.stats()["prefill_tokens_computed"]
    state = p.run(backend=backend, sampling=GREEDY)
    computed = engine.stats()["prefill_tokens_computed"] - before
    prefix_len = len(engine.encode(shared))
    assert prefix_len > 200
    # The prefix once, plus each branch's few tokens (and a boundary token or two).
    assert prefix_len < computed < prefix_len + 4 * 8
    for i in range(4):
        direct = engine.generate(
            f"{shared} Branch {i} says", SamplingParams(max_tokens=4, **HEALED)
        )
        assert direct.text in state.text()
    wait_idle(engine)
    assert_no_kv_leak(engine)


def test_fork_and_join_inside_roles(engine, backend):
    @program
    def p(s):
        s += user("List two ideas.")
        with s.assistant():
            s += "Ideas: "
            forks = s.fork(2)
            for i, f in enumerate(forks):
                f += f"({i}) "
                f += gen("idea", max_tokens=3)
            forks.join()
            s += "; ".join(f["idea"] for f in forks)
        s += user("Thanks")

    state = p.run(backend=backend, sampling=GREEDY)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"].startswith("Ideas: ")
    assert state.text() == engine.tokenizer.apply_chat_template(messages, tokenize=False)


FEWSHOT = "".join(f"Q: What is {a} plus {b}?\nA: {a + b}\n\n" for a, b in [(3, 4), (10, 5)] * 12)


@program
def fewshot(s, a, b):
    s += FEWSHOT + f"Q: What is {a} plus {b}?\nA:"
    s += gen("answer", max_tokens=3, stop="\n")


def test_run_batch_computes_a_shared_fewshot_prefix_once(engine, backend):
    batch = [{"a": i, "b": 2 * i + 1} for i in range(24)]
    engine.flush_cache()
    before = engine.stats()["prefill_tokens_computed"]
    states = fewshot.run_batch(batch, backend=backend, sampling=GREEDY, concurrency=24)
    computed = engine.stats()["prefill_tokens_computed"] - before
    prefix_len = len(engine.encode(FEWSHOT))
    suffix_len = (
        max(
            len(engine.encode(FEWSHOT + f"Q: What is {a} plus {b}?\nA:"))
            for a, b in ((k["a"], k["b"]) for k in batch)
        )
        - prefix_len
    )
    assert prefix_len > 300
    assert computed < prefix_len + 24 * (suffix_len + 2)
    for kwargs, state in zip(batch, states, strict=True):
        assert state.error is None
        prompt = FEWSHOT + f"Q: What is {kwargs['a']} plus {kwargs['b']}?\nA:"
        direct = engine.generate(prompt, SamplingParams(max_tokens=3, stop="\n", **HEALED))
        assert state["answer"] == direct.text


def test_arun_gives_the_same_results_as_run(backend):
    import asyncio

    async def main():
        return await asyncio.gather(
            *(fewshot.arun(a=i, b=1, backend=backend, sampling=GREEDY) for i in range(4))
        )

    states = asyncio.run(main())
    for i, state in enumerate(states):
        assert state["answer"] == fewshot.run(a=i, b=1, backend=backend, sampling=GREEDY)["answer"]


def test_streaming_gives_the_final_text(backend):
    @program
    def p(s):
        s += "Once upon a time"
        s += gen("tale", max_tokens=10)

    state = p.run(stream=True, backend=backend, sampling=GREEDY)
    pieces = list(state.text_iter("tale"))
    assert len(pieces) > 1 and "".join(pieces) == state["tale"]


def test_nested_programs_and_bind(backend):
    @program
    def greet(s, name):
        s += f"Hello {name}. "
        s += gen("greeting", max_tokens=3)

    @program
    def outer(s, name):
        s += "Start. "
        greet(s, name=name)
        s += " End."

    state = outer.run(name="Ada", backend=backend, sampling=GREEDY)
    assert state.text() == f"Start. Hello Ada. {state['greeting']} End."
    assert outer.bind(name="Ada").run(backend=backend, sampling=GREEDY).text() == state.text()


# Bounded strings: the random model would otherwise ramble until max_tokens.
Short = Annotated[str, msgspec.Meta(max_length=8)]
Small = Annotated[int, msgspec.Meta(ge=-99, le=99)]


class Person(msgspec.Struct):
    name: Short
    age: Small


@dataclasses.dataclass
class Point:
    x: Small
    y: Small


class Tag(TypedDict):
    label: Short


def test_typed_gens_come_back_decoded(backend):
    @program
    def p(s):
        s += "Facts: "
        s += gen("n", dtype=int, max_tokens=6)
        s += " "
        s += gen("flag", dtype=bool, max_tokens=3)
        s += " "
        s += gen("person", json_schema=Person, max_tokens=40)
        s += gen("point", json_schema=Point, max_tokens=30)
        s += gen("tag", json_schema=Tag, max_tokens=30)
        s += gen(
            "raw",
            json_schema={
                "type": "object",
                "properties": {"k": {"type": "integer", "maximum": 9}},
                "required": ["k"],
            },
            max_tokens=20,
        )
        s += gen("code", regex=r"[A-Z]{3}-[0-9]{2}", max_tokens=10)

    state = p.run(backend=backend, sampling={"temperature": 0.8, "seed": 1})
    assert isinstance(state["n"], int) and isinstance(state["flag"], bool)
    assert isinstance(state["person"], Person) and isinstance(state["point"], Point)
    assert isinstance(state["tag"], dict) and isinstance(state["tag"]["label"], str)
    assert isinstance(json.loads(state["raw"])["k"], int)
    jsonschema.validate(json.loads(state.meta("person")["text"]), msgspec.json.schema(Person))
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", state["code"])


def test_return_logprobs(engine, backend, reference_logprobs):
    @program
    def p(s):
        s += "Count: one two"
        s += gen("x", max_tokens=5, return_logprobs=True, ignore_eos=True)

    meta = p.run(backend=backend, sampling=GREEDY).meta("x")
    assert len(meta["logprobs"]) == meta["completion_tokens"] == len(meta["token_ids"]) == 5
    # Each is transformers' logprob of that token after the prompt the engine prefilled (the
    # gen heals the prompt: " two" is taken off and written again by the first tokens).
    prompt, healed = engine.prompt_ids("Count: one two", SamplingParams(max_tokens=5, **HEALED))
    assert healed == b" two"
    expected = reference_logprobs(prompt + meta["token_ids"], len(prompt))
    assert meta["logprobs"] == pytest.approx(expected, abs=1e-4)


def test_a_bad_constraint_fails_the_run_with_its_reason(backend):
    @program
    def p(s):
        s += "x"
        s += gen("y", regex="(unclosed")

    with pytest.raises(ValueError, match="regex"):
        p.run(backend=backend)
    states = p.run_batch([{}, {}], backend=backend)
    assert all(isinstance(s.error, ValueError) for s in states)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
