"""SGLang programs written in SGLang's idioms (`import braid as sgl`) on the default model,
sharing one engine: they check that each name works and what shape its results have (types,
variables, choices among the given ones, JSON that parses); what a 135M model answers is out
of scope."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import LiveServer, wait_idle

import braid as sgl


@pytest.fixture(scope="module")
def default_engine(default_model_path):
    """One engine on the default model for the module, the default backend meanwhile."""
    from braid.interpreter import backend as backends
    from braid.runtime import Engine

    previous = backends._default
    # A loaded CI machine may take long to start the constraint compile workers.
    engine = Engine(model=str(default_model_path), grammar_compile_timeout_s=120)
    sgl.set_default_backend(engine)
    yield engine
    sgl.set_default_backend(previous)
    engine.shutdown()


@sgl.function
def qa(s, question):
    s += sgl.system("You answer in a few words.")
    s += sgl.user("Question: " + question)
    s += sgl.assistant("Answer:" + sgl.gen("answer", 6, stop="\n") + ".")
    s += sgl.user_begin() + "Sure?" + sgl.user_end()
    with s.assistant():
        s += sgl.gen("again", max_new_tokens=3)


@pytest.mark.model
def test_chat_program_with_expressions(default_engine):
    from braid.runtime import SamplingParams

    state = qa.run(question="What is the capital of France?", temperature=0)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == "Answer:" + state["answer"] + "."
    assert messages[4]["content"] == state["again"]
    tokenizer = default_engine.tokenizer
    assert state.text() == tokenizer.apply_chat_template(messages, tokenize=False)
    # temperature=0 given to run reached the gen: it is the engine's greedy continuation.
    head = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    direct = default_engine.generate(
        head + "Answer:", SamplingParams(max_tokens=6, stop="\n", temperature=0)
    )
    assert state["answer"] == direct.text
    info = state.get_meta_info("answer")
    assert info["prompt_tokens"] > 10 and 0 < info["completion_tokens"] <= 6
    assert info["finish_reason"]["type"] in ("stop", "length")


@sgl.function
def classify(s, review, how):
    s += sgl.user("Is this review positive or negative? " + review)
    labels = ["positive", "negative"]
    if how == "gen":
        s += sgl.assistant(sgl.gen("label", choices=labels))
    elif how == "select":
        s += sgl.assistant(sgl.select("label", choices=labels, temperature=0))
    else:
        s += sgl.assistant(sgl.select("label", choices=labels, choices_method=how))


@pytest.mark.model
def test_gen_with_choices_scores_like_select(default_engine):
    review = "The battery died after two days. Avoid."
    hows = ["gen", "gen", "gen", "select"]
    hows += [sgl.greedy_token_selection, sgl.unconditional_likelihood_normalized]
    # Sampling at temperature 1 would scatter the gens; scoring gives select's pick each time.
    states = classify.run_batch(
        [{"review": review, "how": how} for how in hows], temperature=1.0, num_threads=6
    )
    labels = [s["label"] for s in states]
    assert all(label in ("positive", "negative") for label in labels)
    assert labels[:3] == [labels[3]] * 3
    info = states[0].get_meta_info("label")
    assert len(info["normalized_prompt_logprobs"]) == 2
    assert states[0].meta("label")["scores"] == pytest.approx(states[3].meta("label")["scores"])
    assert "normalized_unconditional_prompt_logprobs" in states[-1].get_meta_info("label")


SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["age"],
    }
)


@sgl.function
def card(s):
    s += 'Bob is 7 years old and 1.5 m tall. His name in quotes: "Bob".\n'
    s += "Name: " + sgl.gen_string("name", max_tokens=12)
    s += "\nAge: " + sgl.gen_int("age", max_tokens=3)
    s += "\nHeight: " + sgl.gen("height", dtype="float", max_tokens=4)
    s += "\nIs he a child (True or False)? " + sgl.gen("child", dtype=bool, max_tokens=2)
    s += "\nCode: " + sgl.gen("code", regex=r"[A-Z]{2}[0-9]", max_tokens=4)
    s += "\nAs JSON: " + sgl.gen("json", json_schema=SCHEMA, max_tokens=12)


@pytest.mark.model
def test_typed_and_constrained_gens(default_engine):
    state = card.run(temperature=0)
    assert isinstance(state["name"], str)
    assert isinstance(state["age"], int) and isinstance(state["height"], float)
    assert isinstance(state["child"], bool)
    assert len(state["code"]) == 3 and state["code"][:2].isupper() and state["code"][2].isdigit()
    assert 0 <= json.loads(state["json"])["age"] <= 99


@sgl.function
def count(s):
    s += "Count: one two three"
    s += sgl.gen(
        "more",
        max_new_tokens=3,
        ignore_eos=True,
        return_logprob=True,
        top_logprobs_num=2,
        logprob_start_len=1,
        return_text_in_logprobs=True,
    )
    s += sgl.gen("plain", max_tokens=2, ignore_eos=True)


@pytest.mark.model
def test_logprobs_in_sglang_meta_info(default_engine):
    state = count.run(temperature=0)
    info = state.get_meta_info("more")
    assert info["completion_tokens"] == 3 == len(info["output_token_logprobs"])
    for lp, token, text in info["output_token_logprobs"]:
        assert lp <= 0 and isinstance(token, int) and isinstance(text, str)
    assert all(len(top) == 2 for top in info["output_top_logprobs"])
    prompt_ids = default_engine.encode("Count: one two three")
    assert [t for _, t, _ in info["input_token_logprobs"]] == prompt_ids[1:]
    assert "output_token_logprobs" not in state.get_meta_info("plain")
    # return_logprob given to run: every gen reports them.
    info = count.run(temperature=0, return_logprob=True).get_meta_info("plain")
    assert len(info["output_token_logprobs"]) == info["completion_tokens"] == 2


@sgl.function
def tips(s, topic):
    s += f"Two tips about {topic}:\n"
    forks = s.fork(2)
    forks += lambda i: f"Tip {i + 1}:" + sgl.gen("tip", 4, stop="\n")
    s.set_var("fork_tips", [f["tip"] for f in forks])
    forks.join(mode="gather_variable")
    drafts = s.fork(2)
    drafts += lambda i: f" ({i})"
    drafts.join(mode="concate_and_append")
    with s.var_scope("summary"):
        s += " In short:" + sgl.gen("short", max_new_tokens=3)


@pytest.mark.model
def test_forks_join_and_var_scope(default_engine):
    state = tips.run(topic="sleep", temperature=0)
    assert isinstance(state["tip"], list) and len(state["tip"]) == 2
    assert state["tip"] == state["fork_tips"]
    assert state.text() == "Two tips about sleep:\n (0) (1)" + state["summary"]
    assert state["summary"] == " In short:" + state["short"]


@sgl.function
def short_answer(s, question):
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=4, stop="\n")


@pytest.mark.model
def test_run_batch_and_streaming_with_meta(default_engine):
    states = short_answer.run_batch(
        [{"question": "2+2?"}, ("2+2?",)], temperature=0, num_threads=2, progress_bar=False
    )
    assert states[0]["answer"] == states[1]["answer"]

    async def stream():
        state = short_answer.run(question="Name a color.", stream=True, temperature=0)
        pieces = [p async for p in state.text_async_iter("answer", return_meta_data=True)]
        return state, pieces

    state, pieces = asyncio.run(stream())
    assert all(isinstance(text, str) for text, _ in pieces)
    assert "".join(text for text, _ in pieces) == state["answer"]
    assert pieces[-1][1]["completion_tokens"] == state.get_meta_info("answer")["completion_tokens"]


@pytest.mark.model
def test_module_calls_on_the_default_backend(default_engine):
    assert sgl.global_config.default_backend.engine is default_engine
    info = sgl.get_server_info()
    assert info["context_length"] > 0 and "kv_slots_total" in info["stats"]
    wait_idle(default_engine)
    assert sgl.flush_cache() is True
    assert default_engine.stats()["kv_slots_cached"] == 0


@pytest.mark.model
def test_runtime_endpoint_runs_the_same_program(default_engine):
    server = LiveServer(default_engine)
    try:
        endpoint = sgl.RuntimeEndpoint(server.url)
        remote = count.run(backend=endpoint, temperature=0)
        local = count.run(temperature=0)
        assert remote.text() == local.text()
        remote_lps = remote.get_meta_info("more")["output_token_logprobs"]
        local_lps = local.get_meta_info("more")["output_token_logprobs"]
        assert [(t, text) for _, t, text in remote_lps] == [(t, text) for _, t, text in local_lps]
        local_values = [lp for lp, _, _ in local_lps]
        assert [lp for lp, _, _ in remote_lps] == pytest.approx(local_values, abs=1e-4)
        assert sgl.flush_cache(endpoint) is True
        assert "stats" in sgl.get_server_info(endpoint)
    finally:
        server.stop()
