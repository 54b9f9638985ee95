"""SGLang's own test programs, written in its idioms with `import braid as sgl`, on the tiny
model through the default backend, as SGLang users run them: `f(...)` calls, `run_batch` with
`num_threads` and `progress_bar`, `state[name] = ...` on results, forks indexed and joined.
Each result is checked against the engine run directly (greedy, or its scores), so the tests
check what the programs compute, not only that they run."""

from __future__ import annotations

import asyncio
import json
import re

import msgspec
import pytest

import braid as sgl
from braid.runtime import Engine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    """A tiny-model engine, the default backend while this module runs."""
    from braid.interpreter import backend as backends

    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=8192)
    previous = backends._default
    sgl.set_default_backend(engine)
    yield engine
    sgl.set_default_backend(previous)
    engine.shutdown()


def greedy(engine: Engine, prompt: str, **params) -> str:
    """What a greedy gen after `prompt` writes (healing the prompt's end, as a gen does)."""
    return engine.generate(
        prompt, SamplingParams(**{"temperature": 0, "token_healing": True, **params})
    ).text


FEW_SHOT = (
    "The following are questions with answers.\n\n"
    "Q: What is the capital of France?\nA: Paris\n"
    "Q: What is the capital of Germany?\nA: Berlin\n"
)


@sgl.function
def few_shot_qa(s, question):
    s += FEW_SHOT
    s += "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", stop="\n", temperature=0)


def test_few_shot_qa(engine):
    questions = ["What is the capital of Japan?", "What is the capital city of China?"]
    prompts = [f"{FEW_SHOT}Q: {q}\nA:" for q in questions]
    expected = [greedy(engine, prompt, stop="\n", max_tokens=12) for prompt in prompts]
    ret = few_shot_qa.run(question=questions[0], max_new_tokens=12)
    assert ret["answer"] == expected[0]
    rets = few_shot_qa.run_batch(
        [{"question": q} for q in questions], max_new_tokens=12, num_threads=2, progress_bar=True
    )
    assert [r["answer"] for r in rets] == expected


def test_tool_use_called_directly(engine):
    def calculate(expression: str) -> str:  # a tool the random model's text cannot break
        return str(len(expression))

    @sgl.function
    def tool_use(s, lhs, rhs):
        s += "Question: What is the product of " + str(lhs) + " and " + str(rhs) + "?\n"
        s += "Answer: The answer is calculate(" + sgl.gen("expression", stop=")") + ") = "
        with s.var_scope("answer"):
            s += calculate(s["expression"])

    ret = tool_use(lhs=257, rhs=983, temperature=0, max_new_tokens=8)
    head = "Question: What is the product of 257 and 983?\nAnswer: The answer is calculate("
    assert ret["expression"] == greedy(engine, head, stop=")", max_tokens=8)
    assert int(ret["answer"]) == len(ret["expression"])
    assert ret.text() == head + ret["expression"] + ") = " + ret["answer"]


def test_dtype_gen_values_replaced_on_the_result(engine):
    @sgl.function
    def dtype_gen(s):
        s += "Q: Which year was DNS invented?\n"
        s += "A: " + sgl.gen("int_res", dtype=int, max_tokens=8) + "\n"
        s += "Q: What is the value of pi?\n"
        s += "A: " + sgl.gen("float_res", dtype=float, max_tokens=8) + "\n"
        s += "Q: Is the sky blue?\n"
        s += "A: " + sgl.gen("bool_res", dtype=bool) + "\n"
        s += "Q: What is the full name of DNS?\n"
        s += "A: " + sgl.gen("str_res", dtype=str, stop="\n", max_tokens=8) + "\n"

    state = dtype_gen.run()
    state["int_res"] = int(state["int_res"])
    state["float_res"] = float(state["float_res"])
    state["bool_res"] = bool(state["bool_res"])
    assert state["int_res"] == int(state.meta("int_res")["text"])
    assert state["float_res"] == float(state.meta("float_res")["text"])
    assert state["bool_res"] is (state.meta("bool_res")["text"] == "True")
    # A string literal max_tokens cut keeps its text; a whole one is stored unquoted.
    text = state.meta("str_res")["text"]
    complete = re.fullmatch(r'"[^"]*"', text) is not None
    assert state["str_res"] == (json.loads(text) if complete else text)


class Age(msgspec.Struct):
    age: int


def test_a_cut_literal_keeps_its_text_only_in_sglang_programs(engine):
    def body(s):
        s += "Letters: " + sgl.gen("letters", regex="[a-z]{30}", max_tokens=3)
        s += "\nAs JSON: " + sgl.gen("json", json_schema=Age, max_tokens=2, json_compact=True)

    state = sgl.function(body).run(temperature=0)
    assert state["letters"] == greedy(engine, "Letters: ", regex="[a-z]{30}", max_tokens=3)
    assert re.fullmatch("[a-z]+", state["letters"]) and len(state["letters"]) < 30
    # Two tokens cannot hold {"age": n}: the text as generated, as SGLang keeps it.
    assert state["json"] == state.meta("json")["text"] and state["json"].startswith("{")
    assert state.get_meta_info("json")["finish_reason"] == {"type": "length", "length": 2}
    with pytest.raises(ValueError, match=r"gen\('json'\): cannot decode"):
        sgl.program(body).run(temperature=0)  # braid's own programs keep their rule


TIPS = 3


@sgl.function
def parallel_decoding(s, topic):
    s += "Act as a helpful assistant.\n"
    s += "USER: Give some tips for " + topic + ".\n"
    s += "ASSISTANT: Okay. Here are " + str(TIPS) + " concise tips:\n"
    with s.var_scope("skeleton"):
        for i in range(1, 1 + TIPS):
            s += f"{i}." + sgl.gen(max_tokens=6, stop=[".", "\n"]) + ".\n"
    forks = s.fork(TIPS)
    for i in range(TIPS):
        forks[i] += f"Now, I expand tip {i + 1} into a paragraph:\nTip {i + 1}:"
        forks[i] += sgl.gen("detailed_tip", 8, stop=["\n\n"])
    forks.join()
    s += "Here are these tips with detailed explanation:\n"
    for i in range(TIPS):
        s += f"Tip {i + 1}:" + forks[i]["detailed_tip"] + "\n"
    s += "\nIn summary," + sgl.gen("summary", max_tokens=8)


def test_parallel_decoding(engine):
    ret = parallel_decoding.run(topic="writing a blog post", temperature=0)
    head = (
        "Act as a helpful assistant.\nUSER: Give some tips for writing a blog post.\n"
        f"ASSISTANT: Okay. Here are {TIPS} concise tips:\n" + ret["skeleton"]
    )
    tips = ret["detailed_tip"]  # the forks' values, gathered in order by join
    for i, tip in enumerate(tips):
        prompt = head + f"Now, I expand tip {i + 1} into a paragraph:\nTip {i + 1}:"
        assert tip == greedy(engine, prompt, stop=["\n\n"], max_tokens=8)
    body = "".join(f"Tip {i + 1}:{tip}\n" for i, tip in enumerate(tips))
    summary_prompt = head + "Here are these tips with detailed explanation:\n" + body
    summary_prompt += "\nIn summary,"
    assert ret.text() == summary_prompt + ret["summary"]
    assert ret["summary"] == greedy(engine, summary_prompt, max_tokens=8)


@sgl.function
def chat_qa(s, question):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


def test_stream_a_called_function(engine):
    question = "Describe a trip to Hawaii."
    ret = chat_qa(question=question, stream=True, temperature=0)
    streamed = "".join(ret.text_iter())
    assert streamed == ret.text()
    ret = chat_qa(question=question, stream=True, temperature=0)
    answer = "".join(ret.text_iter("answer"))
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": question},
    ]
    prompt = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    # A gen right after a role's opening is not healed (the text ends in markup).
    assert answer == ret["answer"] == greedy(engine, prompt, max_tokens=8, token_healing=False)
    assert ret.messages() == [*messages, {"role": "assistant", "content": answer}]


def test_multi_turn_with_role_blocks(engine):
    @sgl.function
    def answer_mt_bench(s, question_1, question_2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question_1)
        s += sgl.assistant(sgl.gen("answer_1"))
        with s.user():
            s += question_2
        with s.assistant():
            s += sgl.gen("answer_2")

    ret = answer_mt_bench.run(question_1="Hi.", question_2="Again.", max_new_tokens=6)
    messages = ret.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [messages[2]["content"], messages[4]["content"]] == [ret["answer_1"], ret["answer_2"]]
    assert ret.text() == engine.tokenizer.apply_chat_template(messages, tokenize=False)


CHOICES = ["True", "False", "Unknown"]


@sgl.function
def true_or_false(s, statement, how):
    s += "Determine whether the statement below is True, False, or Unknown.\n"
    s += "Statement: " + statement + "\n"
    if how == "select":
        s += "Answer:" + sgl.select("answer", CHOICES)
    else:
        s += "Answer:" + sgl.gen("answer", choices=CHOICES)


def test_select_in_a_generator_style_batch(engine):
    statements = ["The capital of Germany is Berlin.", "Purple is a better color than green."]
    items = [(statement, how) for statement in statements for how in ("select", "gen")]
    rets = true_or_false.run_batch(
        items, temperature=0, num_threads=4, progress_bar=True, generator_style=True
    )
    for (statement, _), ret in zip(items, rets, strict=True):
        prefix = (
            "Determine whether the statement below is True, False, or Unknown.\n"
            f"Statement: {statement}\nAnswer:"
        )
        logprobs = asyncio.run(engine.ascore(prefix, CHOICES))
        means = [sum(lp) / len(lp) for lp in logprobs]
        assert ret["answer"] == CHOICES[means.index(max(means))]
        info = ret.get_meta_info("answer")
        assert info["normalized_prompt_logprobs"] == pytest.approx(means)
        assert ret.text() == prefix + ret["answer"]
