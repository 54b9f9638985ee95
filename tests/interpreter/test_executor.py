"""The executor's semantics on a scripted backend: `+=` returns at once, operations run in
order, forks start from the parent's text, failures stay in their state, streaming."""

from __future__ import annotations

import asyncio
import threading

import pytest
from backend_doubles import ScriptedBase
from conftest import async_wait_for, wait_for

from braid import gen, program, select, user
from braid.interpreter import ChatTemplate, ProgramError
from braid.runtime.protocol import GenerateOutput


class ScriptedBackend(ScriptedBase):
    """Every gen answers "<reply #k>" in two pieces once `release` is set; select scores a
    choice by minus its length (the shortest wins). Records each gen's program id, each
    release of one, and each constraint compiled ahead."""

    def __init__(self, tokenizer) -> None:
        self.chat_template = ChatTemplate.from_tokenizer(tokenizer)
        self.release = threading.Event()
        self.release.set()
        self.prompts: list[str] = []
        self.scored: list[tuple[str, list[str]]] = []
        self.programs: list[str | None] = []
        self.released: list[tuple[str, str | None]] = []
        self.compiled: list[str | None] = []  # the regex of each params compiled ahead

    async def generate(self, prompt, params, on_text, lora=None, program=None):
        self.prompts.append(prompt)
        self.programs.append(program)
        k = len(self.prompts)
        await async_wait_for(self.release.is_set, what="the test to release the gens")
        if params.regex == "fail":
            raise ValueError("scripted failure")
        on_text(f"<reply #{k}")
        on_text(">")
        return GenerateOutput(f"<reply #{k}>", [1, 2], "stop", {"completion_tokens": 2})

    async def score(self, prefix, continuations, lora=None):
        self.scored.append((prefix, continuations))
        return [[-float(len(c))] for c in continuations]

    def compile_ahead(self, params) -> None:
        self.compiled.append(params.regex)

    async def release_program(self, program, lora=None) -> None:
        self.released.append((program, lora))


@pytest.fixture
def backend(tokenizer):
    return ScriptedBackend(tokenizer)


def test_append_returns_before_the_gen_finishes(backend):
    backend.release.clear()
    reached = threading.Event()

    @program
    def p(s):
        s += "Q: "
        s += gen("a")
        s += " then "
        reached.set()  # the program goes on while its gen waits in the backend
        s += gen("b")

    state = p.run(stream=True, backend=backend)
    assert reached.wait(10)
    wait_for(lambda: backend.prompts, what="the first gen to reach the backend")
    assert backend.prompts == ["Q: "]
    backend.release.set()
    assert "".join(state.text_iter()) == "Q: <reply #1> then <reply #2>"
    assert state["a"] == "<reply #1>" and state["b"] == "<reply #2>"
    assert backend.prompts == ["Q: ", "Q: <reply #1> then "]


def test_a_constraint_compiles_ahead_when_its_gen_is_submitted(backend):
    backend.release.clear()

    @program
    def p(s):
        s += gen("a")
        s += gen("b", regex="[a-z]+")

    state = p.run(stream=True, backend=backend)
    wait_for(lambda: backend.compiled and backend.prompts, what="gen a to run, b to compile")
    assert backend.compiled == ["[a-z]+"] and backend.prompts == [""]  # gen b waits for a
    backend.release.set()
    state.sync()
    assert backend.compiled == ["[a-z]+"]


def test_each_state_names_itself_on_its_gens_and_releases_its_lease_when_done(backend):
    @program
    def p(s):
        s += gen("a")
        for f in s.fork(2):
            f += gen("x")
        s += gen("b", lora="other")  # under another adapter: no lease of the state's

    p.run(backend=backend)
    root, *rest = backend.programs
    assert root is not None and rest.count(None) == 1
    children = {x for x in rest if x is not None}
    assert len(children) == 2 and root not in children  # each fork is a state of its own
    wait_for(lambda: len(backend.released) == 3, what="the states to release their leases")
    assert sorted(backend.released) == sorted((x, None) for x in (root, *children))


def test_reading_a_variable_waits_for_it(backend):
    @program
    def p(s):
        s += gen("a")
        s += " and " + s["a"]  # reads the finished value

    assert p.run(backend=backend).text() == "<reply #1> and <reply #1>"


def test_fork_children_start_from_the_parents_text_at_the_fork(backend):
    @program
    def p(s):
        s += "root "
        forks = s.fork(3)
        s += "parent-only "  # after the fork: no child sees it
        for i, f in enumerate(forks):
            f += f"child{i} "
            f += gen("x")
        s += "|".join(f["x"] for f in forks)

    state = p.run(backend=backend)
    assert sorted(backend.prompts) == ["root child0 ", "root child1 ", "root child2 "]
    assert state.text().startswith("root parent-only <reply #")
    assert state.text().count("<reply #") == 3


def test_forks_see_parent_variables_and_own_their_own(backend):
    @program
    def p(s):
        s += gen("base")
        a, b = s.fork(2)
        a += gen("x")
        assert a["base"] == b["base"] == s["base"]
        with pytest.raises(KeyError, match="no variable 'x'"):
            b["x"]

    p.run(backend=backend)


def test_select_picks_the_best_score_and_records_it(backend):
    @program
    def p(s):
        s += "Pick: "
        s += select("c", ["three", "one", "two"])

    state = p.run(backend=backend)
    assert state["c"] == "one" and state.text() == "Pick: one"
    assert state.meta("c")["scores"] == [-5.0, -3.0, -3.0]  # the earliest of a tie wins
    assert backend.scored == [("Pick: ", ["three", "one", "two"])]


def test_unconditional_select_scores_choices_after_the_message_opening(backend):
    @program
    def p(s):
        s += user("Question? ", select("c", ["yes", "no"], "unconditional_likelihood_normalized"))

    p.run(backend=backend)
    opening = backend.chat_template.begin("user", first=False)
    assert backend.scored[1] == (opening, ["yes", "no"])


def test_a_failing_operation_fails_its_state_only(backend):
    @program
    def p(s, bad):
        s += gen("a", regex="fail" if bad else None)
        s += gen("b")

    with pytest.raises(ValueError, match="scripted failure"):
        p.run(bad=True, backend=backend)
    ok, bad = p.run_batch([{"bad": False}, {"bad": True}], backend=backend)
    assert ok.error is None and ok["b"].startswith("<reply")
    assert isinstance(bad.error, ValueError)
    with pytest.raises(ProgramError, match="cannot read 'b'"):
        bad["b"]


def test_an_exception_in_the_program_is_captured_in_a_batch(backend):
    @program
    def p(s, n):
        s += gen("a")
        if n == 1:
            raise KeyError("boom")

    states = p.run_batch([{"n": i} for i in range(3)], backend=backend, concurrency=2)
    assert [type(s.error) for s in states] == [type(None), KeyError, type(None)]
    assert states[2]["a"].startswith("<reply")


def test_streaming_one_variable(backend):
    @program
    def p(s):
        s += "a "
        s += gen("x")
        s += " b"

    state = p.run(stream=True, backend=backend)
    assert list(state.text_iter("x")) == ["<reply #1", ">"]

    async def collect():
        return [t async for t in p.run(stream=True, backend=backend).text_async_iter()]

    assert "".join(asyncio.run(collect())) == "a <reply #2> b"


def test_arun_runs_programs_concurrently(backend):
    backend.release.clear()

    @program
    def p(s, i):
        s += f"{i}: "
        s += gen("x")

    async def main():
        tasks = [asyncio.ensure_future(p.arun(i=i, backend=backend)) for i in range(5)]
        # All five gens are in the backend at once.
        await async_wait_for(lambda: len(backend.prompts) == 5, what="five gens in the backend")
        backend.release.set()
        return await asyncio.gather(*tasks)

    states = asyncio.run(main())
    assert [s.text().split(":")[0] for s in states] == ["0", "1", "2", "3", "4"]


def test_a_finished_state_takes_no_more_text(backend):
    @program
    def p(s):
        s += "x"

    state = p.run(backend=backend)
    with pytest.raises(RuntimeError, match="has finished"):
        state += "more"
