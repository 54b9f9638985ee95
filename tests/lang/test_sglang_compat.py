"""SGLang frontend programs run on braid with `import braid as sgl`.

The first tests check what SGLang's names build, without a model (and on a scripted backend
where they run). The tests marked `model` run programs written in SGLang's idioms on the
default model, sharing one engine: they check that each name works and what shape its
results have (types, variables, choices among the given ones, JSON that parses); what a
135M model answers is out of scope.
"""

from __future__ import annotations

import asyncio
import json
import threading

import msgspec
import pytest
from backend_doubles import ScriptedBase
from conftest import LiveServer, wait_for, wait_idle

import braid as sgl
from braid.interpreter.ir import Parts, Role, RoleBegin, RoleEnd, Select
from braid.meta_info import sglang_meta_info
from braid.runtime.protocol import GenerateOutput

# Every name SGLang's frontend exports that a program can use on braid.
SGLANG_NAMES = (
    "function gen gen_int gen_string select image video system user assistant system_begin "
    "system_end user_begin user_end assistant_begin assistant_end set_default_backend "
    "flush_cache get_server_info RuntimeEndpoint OpenAI global_config separate_reasoning "
    "token_length_normalized greedy_token_selection unconditional_likelihood_normalized"
).split()


# ---- without a model --------------------------------------------------------------------


def test_every_sglang_name_is_exported():
    for name in SGLANG_NAMES:
        assert getattr(sgl, name) is not None, name
        assert name in sgl.__all__
    assert sgl.function is not sgl.program and sgl.program.__name__ == "program"


def test_expressions_join_into_parts_in_order():
    answer = sgl.gen("answer")
    joined = "A:" + answer
    assert isinstance(joined, Parts) and joined.items == ("A:", answer)
    choice = sgl.select("c", choices=["x", "y"])
    longer = "Q " + answer + " then " + choice + "."
    assert longer.items == ("Q ", answer, " then ", choice, ".")
    assert (answer + "text").items == (answer, "text")
    both = sgl.system("Be brief.") + sgl.user("Hi")
    assert [type(p) for p in both.items] == [Role, Role]


def test_roles_take_joined_parts():
    g = sgl.gen("g")
    message = sgl.user("x" + g + "y")
    assert message.role == "user" and message.parts == ("x", g, "y")
    assert sgl.assistant().parts == ()  # SGLang's empty message
    with pytest.raises(TypeError, match="parts must be text, gen or select"):
        sgl.user("a" + sgl.assistant("nested"))
    begins = [sgl.system_begin(), sgl.user_begin(), sgl.assistant_begin()]
    ends = [sgl.system_end(), sgl.user_end(), sgl.assistant_end()]
    assert [b.role for b in begins] == [e.role for e in ends] == ["system", "user", "assistant"]
    assert all(isinstance(b, RoleBegin) for b in begins)
    assert all(isinstance(e, RoleEnd) for e in ends)


def test_gen_maps_sglang_keywords_onto_sampling_params():
    g = sgl.gen("x", 64, stop="\n", top_k=-1, min_new_tokens=2, ignore_eos=True)
    assert g.sampling == {
        "max_tokens": 64,
        "stop": "\n",
        "top_k": 0,  # SGLang's "off"
        "min_tokens": 2,
        "ignore_eos": True,
    }
    g = sgl.gen(
        "x",
        max_new_tokens=5,
        return_logprob=True,
        top_logprobs_num=3,
        logprob_start_len=0,
        return_text_in_logprobs=True,
        spaces_between_special_tokens=True,
        temperature=None,  # SGLang's "not given"
    )
    assert g.sampling == {
        "max_tokens": 5,
        "logprobs": True,
        "top_logprobs": 3,
        "prompt_logprobs_from": 1,  # the first prompt token has no logprob
    }
    assert "prompt_logprobs_from" not in sgl.gen("x", logprob_start_len=-1).sampling
    with pytest.raises(ValueError, match="spaces_between_special_tokens must be True"):
        sgl.gen("x", spaces_between_special_tokens=False)
    with pytest.raises(TypeError, match="max_tokens is given twice"):
        sgl.gen("x", 8, max_new_tokens=8)
    with pytest.raises(TypeError, match="unknown parameter 'max_new_token'"):
        sgl.gen("x", max_new_token=8)


@pytest.mark.parametrize(
    ("dtype", "text", "value"),
    [("int", "42", 42), (int, "-3", -3), ("float", "1.5", 1.5), (float, "2", 2.0)]
    + [("bool", "True", True), (bool, "False", False), ("str", '"a b"', "a b")]
    + [(str, '"q"', "q"), ("string", '"x"', "x")],
)
def test_gen_dtype_by_name_or_type(dtype, text, value):
    g = sgl.gen("x", dtype=dtype)
    assert "regex" in g.sampling and g.decode(text) == value
    assert sgl.gen_int("n", 4).decode("7") == 7 and sgl.gen_int("n", 4).sampling["max_tokens"] == 4
    assert sgl.gen_string("s", max_tokens=4).decode('"hi"') == "hi"
    with pytest.raises(ValueError, match="dtype must be one of"):
        sgl.gen("x", dtype="complex")


def test_gen_with_choices_is_a_select():
    s = sgl.gen("c", choices=["yes", "no"])
    assert isinstance(s, Select) and s.choices == ("yes", "no")
    assert s.method == "token_length_normalized"
    methods = {
        sgl.token_length_normalized: "token_length_normalized",
        sgl.greedy_token_selection: "greedy",
        sgl.unconditional_likelihood_normalized: "unconditional_likelihood_normalized",
    }
    for method, name in methods.items():
        assert sgl.gen("c", choices=["a", "b"], choices_method=method).method == name
        assert sgl.select("c", choices=["a", "b"], choices_method=method).method == name
        assert sgl.select("c", ["a", "b"], name).method == name  # braid's own spelling
    assert sgl.select("c", ["a", "b"], temperature=0).method == "token_length_normalized"
    with pytest.raises(ValueError, match="temperature must be 0"):
        sgl.select("c", ["a", "b"], temperature=0.7)
    with pytest.raises(ValueError, match="at most one constraint"):
        sgl.gen("c", choices=["a"], regex="a")
    with pytest.raises(ValueError, match="choices_method needs choices"):
        sgl.gen("c", choices_method=sgl.greedy_token_selection)


def test_what_braid_cannot_do_says_so():
    with pytest.raises(NotImplementedError, match="text-only"):
        sgl.image("cat.png")
    with pytest.raises(NotImplementedError, match="text-only"):
        sgl.video("cat.mp4", 8)
    with pytest.raises(ValueError, match="num_api_spec_tokens"):
        sgl.function(num_api_spec_tokens=64)
    with pytest.raises(ValueError, match="Azure"):
        sgl.OpenAI("gpt-4o-mini", is_azure=True)
    g = sgl.gen("x")
    assert sgl.separate_reasoning(g, model_type="deepseek-r1") is g


def test_global_config():
    config = sgl.global_config
    assert config.verbosity == 0 and config.skip_special_tokens_in_output is True
    config.enable_precache_with_tracing = False  # an optimisation braid does not need
    config.enable_precache_with_tracing = True
    with pytest.raises(ValueError, match="implements True only"):
        config.skip_special_tokens_in_output = False
    with pytest.raises(AttributeError, match="no 'verbose'"):
        config.verbose = 2


def test_function_decorates_both_ways():
    @sgl.function
    def a(s):
        s += "a"

    @sgl.function()
    def b(s):
        s += "b"

    assert isinstance(a, sgl.Program) and isinstance(b, sgl.Program) and a.name == "a"


def test_openai_takes_sglang_arguments(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    chat = sgl.OpenAI("gpt-4o-mini")
    assert chat.model == "gpt-4o-mini" and chat.http.base_url == "http://127.0.0.1:9/v1"
    assert chat.http.headers == {"Authorization": "Bearer sk-test"}
    text = sgl.OpenAI("gpt-3.5-turbo-instruct", is_chat_model=False, base_url="http://h/v1")
    assert text.http.base_url == "http://h/v1"
    with pytest.raises(ValueError, match="cannot render a user message"):
        text.chat_template.begin("user", first=True)


def test_sglang_meta_info_shape():
    gen_meta = {
        "text": " four five",
        "finish_reason": "length",
        "token_ids": [11, 12],
        "prompt_tokens": 6,
        "cached_tokens": 2,
        "completion_tokens": 2,
        "logprobs": [-0.5, -1.0],
        "top_logprobs": [{11: -0.5, 13: -2.0}, {12: -1.0, 14: -1.5}],
        "prompt_logprobs": [-3.0],
        "prompt_token_ids": [9],
    }
    info = sglang_meta_info(gen_meta, lambda ids: [f"<{i}>" for i in ids])
    assert info["finish_reason"] == {"type": "length", "length": 2}
    assert (info["prompt_tokens"], info["completion_tokens"], info["cached_tokens"]) == (6, 2, 2)
    assert info["output_token_logprobs"] == [[-0.5, 11, "<11>"], [-1.0, 12, "<12>"]]
    assert info["output_top_logprobs"][1] == [[-1.0, 12, "<12>"], [-1.5, 14, "<14>"]]
    assert info["input_token_logprobs"] == [[-3.0, 9, "<9>"]]
    select_meta = {"choices": ["a", "b"], "scores": [0.5, 0.1], "logprobs": [[-1.0, -2.0], [-4.0]]}
    info = sglang_meta_info(select_meta, None)
    assert info["normalized_prompt_logprobs"] == [-1.5, -4.0]
    assert info["input_token_logprobs"][0] == [[-1.0, None, None], [-2.0, None, None]]
    assert sglang_meta_info({}, None) is None  # set_var, var_scope: SGLang has none either


class RecordingBackend(ScriptedBase):
    """Each gen answers the next of `replies` ((text, finish reason) pairs), then "<k>" (k
    counting from 1) with finish reason "stop", and records its params; select picks the
    shortest choice."""

    def __init__(self, tokenizer, replies=()) -> None:
        from braid.interpreter import ChatTemplate

        self.chat_template = ChatTemplate.from_tokenizer(tokenizer)
        self.params = []
        self.replies = list(replies)

    async def generate(self, prompt, params, on_text, lora=None, program=None):
        self.params.append(params)
        text, reason = self.replies.pop(0) if self.replies else (f"<{len(self.params)}>", "stop")
        on_text(text)
        return GenerateOutput(text, [1], reason, {"completion_tokens": 1})

    async def score(self, prefix, continuations, lora=None):
        return [[-float(len(c))] for c in continuations]


@pytest.fixture
def recorder(tokenizer):
    return RecordingBackend(tokenizer)


def test_run_and_run_batch_take_sampling_keywords(recorder):
    @sgl.function
    def p(s, stop):  # a parameter named like a sampling field stays the program's
        s += stop + sgl.gen("a", stop=stop) + sgl.gen("b", max_tokens=3)

    state = p.run("!", backend=recorder, temperature=0, max_new_tokens=9, top_k=-1)
    a, b = recorder.params
    assert (a.temperature, a.max_tokens, a.top_k, a.stop) == (0, 9, 0, "!")
    assert (b.temperature, b.max_tokens) == (0, 3)  # the gen's own value wins
    assert state.text() == "!<1><2>"
    states = p.run_batch(
        [{"stop": "?"}, (".",)],
        backend=recorder,
        temperature=0.5,
        max_new_tokens=4,
        num_threads=2,
        progress_bar=False,
    )
    assert all(s.error is None for s in states)
    assert sorted(s.text()[0] for s in states) == [".", "?"]
    assert {(g.temperature, g.max_tokens) for g in recorder.params[2:]} == {(0.5, 4), (0.5, 3)}
    with pytest.raises(TypeError, match="run_batch: unknown parameter 'temprature'"):
        p.run_batch([{"stop": "x"}], backend=recorder, temprature=0)


def test_state_methods_forks_and_joins(recorder):
    @sgl.function
    def p(s):
        s += "Start. "
        with s.var_scope("intro"):
            s += "Hello " + sgl.gen("name")
        s.set_var("k", 1)
        s["k2"] = 2
        forks = s.fork(3)
        forks += lambda i: f"[{i}]" + sgl.gen("tip")
        forks += [" x", " y", " z"]
        s.set_var("fork_tips", [f["tip"] for f in forks])
        forks.join()
        s += " Then"
        more = s.fork(2)
        more += lambda i: f" ({i})"
        more.join(mode="concate_and_append")
        s.user("Question " + sgl.gen("q"))
        with s.assistant():
            s += sgl.select("c", choices=["long", "no"])
        s.sync()
        assert "c" in s and "missing" not in s
        with pytest.raises(ValueError, match="the mode is one of"):
            more.join(mode="merge")

    state = p.run(backend=recorder)
    assert state["intro"] == "Hello <1>" and state.get_var("k") == 1 and state["k2"] == 2
    assert state["tip"] == state["fork_tips"] and len(state["tip"]) == 3
    assert state["name"] == "<1>"  # the forks inherited it: only their new variables gather
    assert state.text().startswith("Start. Hello <1> Then (0) (1)")
    assert [m["role"] for m in state.messages()] == ["user", "assistant"]
    assert state["c"] == "no" and state.get_meta_info("c")["normalized_prompt_logprobs"]
    assert state.get_meta_info("k") is None
    assert "".join(state.text_iter(var_name="q")) == state["q"]


def test_calling_a_function_runs_it(recorder):
    @sgl.function
    def qa(s, question):
        s += "Q: " + question + "\nA:" + sgl.gen("answer", stop="\n")
        return len(question)

    state = qa(question="Why?", temperature=0, max_new_tokens=5, top_k=-1, backend=recorder)
    (params,) = recorder.params
    assert (params.temperature, params.max_tokens, params.top_k, params.stop) == (0, 5, 0, "\n")
    assert state["answer"] == "<1>" and state.text() == "Q: Why?\nA:<1>"
    assert state.ret_value == 4  # what the function returned, SGLang's state.ret_value
    assert qa("How?", backend=recorder, use_thread=False).text() == "Q: How?\nA:<2>"
    bound = qa.bind(question="Who?")
    assert isinstance(bound, sgl.sglang.Function) and bound(backend=recorder)["answer"] == "<3>"
    with pytest.raises(TypeError, match="unexpected keyword argument 'questoin'"):
        qa(questoin="Why?", backend=recorder)

    @sgl.function
    def outer(s):
        s += "Start. "
        qa(s, "Inner?")  # a state first: appended to it, as in a braid program
        s += " End."

    assert outer(backend=recorder).text() == "Start. Q: Inner?\nA:<4> End."


def test_a_called_function_streams(recorder):
    @sgl.function
    def qa(s, question):
        s += sgl.system("Be brief.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer"))

    state = qa(question="Hi?", stream=True, backend=recorder)
    assert "".join(state.text_iter()) == state.text()
    assert state.text().endswith(state["answer"] + recorder.chat_template.end("assistant"))
    state = qa(question="Hi?", stream=True, backend=recorder)
    assert "".join(state.text_iter("answer")) == state["answer"] == "<2>"


def test_a_finished_state_takes_new_values(tokenizer):
    backend = RecordingBackend(tokenizer, [("24", "stop"), ("365", "stop")])

    @sgl.function
    def dtype_gen(s):
        s += "Hours in a day: " + sgl.gen("int_res", regex="[0-9]+") + "\n"
        s += "Days in a year: " + sgl.gen("days", stop="\n")

    state = dtype_gen.run(backend=backend)
    state["int_res"] = int(state["int_res"])  # SGLang's idiom
    state.set_var("days", int(state.get_var("days")))
    assert state["int_res"] == 24 and state["days"] == 365
    assert state.get_meta_info("int_res")["completion_tokens"] == 1  # the gen's, kept
    state["note"] = "checked"
    assert "note" in state and state["note"] == "checked"
    assert state.get_meta_info("note") is None
    assert state.text() == "Hours in a day: 24\nDays in a year: 365"  # the text is as it was


def test_a_value_set_after_the_function_returned_follows_its_gens(tokenizer):
    """A streamed state whose function has returned while its gen still runs: the value set
    comes after the gen's."""
    from tests.interpreter.test_executor import ScriptedBackend

    backend = ScriptedBackend(tokenizer)
    backend.release.clear()

    @sgl.function
    def p(s):
        s += sgl.gen("a")

    state = p.run(stream=True, backend=backend)
    wait_for(lambda: state._executor._closed, what="the program function to return")
    setter = threading.Thread(target=state.__setitem__, args=("a", "mine"))
    setter.start()
    backend.release.set()
    setter.join(30)
    assert not setter.is_alive()
    assert state.text() == "<reply #1>"  # waits for the gen, which set "a" first
    assert state["a"] == "mine"


# A cut literal of each typed gen: a sign without digits, a string without its closing
# quote, a float without its exponent, a JSON object missing its end.
CUT = [("-", "length"), ('"Par', "length"), ("1e", "length"), ('{"age": 3', "length")]


class Age(msgspec.Struct):
    age: int


def typed(s):
    s += "n=" + sgl.gen_int("n", 1) + " s=" + sgl.gen_string("s", max_tokens=2)
    s += " f=" + sgl.gen("f", dtype="float", max_new_tokens=2)
    forks = s.fork(1)  # forks keep their program's rule
    forks[0] += sgl.gen("age", json_schema=Age, max_tokens=4)
    s.set_var("age", forks[0]["age"])


def test_sglang_typed_gens_keep_a_cut_text(tokenizer):
    backend = RecordingBackend(tokenizer, CUT)
    state = sgl.function(typed).run(backend=backend)
    assert [state[k] for k in ("n", "s", "f", "age")] == [text for text, _ in CUT]
    assert state.meta("s")["finish_reason"] == "length"
    assert state.get_meta_info("n")["finish_reason"] == {"type": "length", "length": 1}
    # A whole literal still decodes.
    whole = [("7", "stop"), ('"a b"', "stop"), ("2.5", "stop"), ('{"age": 3}', "stop")]
    state = sgl.function(typed).run(backend=RecordingBackend(tokenizer, whole))
    assert [state[k] for k in ("n", "s", "f", "age")] == [7, "a b", 2.5, Age(3)]


def test_braid_programs_fail_on_a_cut_literal(tokenizer):
    with pytest.raises(ValueError, match=r"gen\('n'\): cannot decode '-' \(finish reason length"):
        sgl.program(typed).run(backend=RecordingBackend(tokenizer, CUT))
    states = sgl.program(typed).run_batch(
        [{}, {}], backend=RecordingBackend(tokenizer, CUT[1:]), num_threads=1
    )
    assert "cannot decode '\"Par'" in str(states[0].error)


def test_run_batch_generator_style(recorder):
    @sgl.function
    def echo(s, x):
        s += x + sgl.gen("y")

    items = [{"x": str(i)} for i in range(5)]
    states = echo.run_batch(items, backend=recorder, generator_style=True, progress_bar=True)
    assert not isinstance(states, list) and not recorder.params  # nothing runs until iterated
    texts = [state.text() for state in states]
    assert [t[0] for t in texts] == ["0", "1", "2", "3", "4"]  # the batch's order
    assert sorted(t[1:] for t in texts) == sorted(f"<{k}>" for k in range(1, 6))
    assert echo.run_batch([], backend=recorder) == []


def test_fork_of_one_and_copy(recorder):
    @sgl.function
    def p(s):
        s += "Q."
        with s.copy() as c:
            c += " draft" + sgl.gen("draft")
        (f,) = s.fork()  # SGLang's default size
        f += sgl.gen("other")
        s += " A" + f["other"]

    state = p.run(backend=recorder)
    assert state["draft"] == ["<1>"]  # joined: a list of the one copy's value
    assert state.text() == "Q. A<2>"  # the copy's text stays in the copy
    assert "other" not in state  # the fork was not joined


def test_program_defaults_take_one_sample(recorder):
    @sgl.function
    def p(s):
        s += sgl.gen("a")

    with pytest.raises(ValueError, match="n must be 1; fork the state"):
        p.run(backend=recorder, n=2)


# ---- on the default model ---------------------------------------------------------------


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
