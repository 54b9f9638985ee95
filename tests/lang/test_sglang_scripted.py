"""SGLang programs (`import braid as sgl`) run on a scripted backend that records what each
gen asks for: run and run_batch keywords, state methods, forks, direct calls and streams,
finished states, typed gens cut short, generator-style batches."""

from __future__ import annotations

import threading

import msgspec
import pytest
from backend_doubles import ScriptedBase
from conftest import wait_for

import braid as sgl
from braid.runtime.protocol import GenerateOutput


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
