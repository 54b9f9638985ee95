"""The client libraries docs/server.md says work against `braid serve`, running their own code
against one `braid serve` on a tiny random model: instructor, LangChain (langchain-openai),
pydantic-ai, the OpenAI Agents SDK (both of its models), SGLang's frontend (RuntimeEndpoint)
and, slow, lm-evaluation-harness's local-completions model.

Each library runs in its own venv (scripts/peer_venv.sh clients, or lm-eval; tests/conftest.py
starts making the clients' one in the background as the run starts), never braid's: a script
per library in clients/ takes the server's URL and prints one JSON line, with the request
bodies the library sent. The model writes gibberish, so every valid output here is braid's
constraint's doing: tool arguments and response formats validate against the schemas the
library sent, checked again here with jsonschema."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path
from unittest.mock import ANY

import jsonschema
import pytest
from conftest import ServeProcess, peer_python

import braid as sgl

CLIENTS = Path(__file__).resolve().parent / "clients"

# The first test waits for the clients' venv while it is made (~100 s on 2 cores).
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def model_path(long_tiny_model):
    # Decisive greedy picks (a sharp head), a context that holds the tool preambles.
    return long_tiny_model(8.0, tied=False)


@pytest.fixture(scope="module")
def serve(model_path):
    with ServeProcess(model_path, "--served-model-name", "tiny", "--max-kv-tokens", "8192") as s:
        yield s


@pytest.fixture(scope="module")
def clients_python() -> str:
    return peer_python("clients")


def run_client(python: str, script: str, *args: str, cwd: Path | None = None) -> dict:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(
        [python, str(CLIENTS / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def only(sent: list[dict], path: str) -> dict:
    [request] = sent
    assert request["path"] == path
    return request["body"]


def tool_schema(body: dict, name: str) -> dict:
    [spec] = [t["function"] for t in body["tools"] if t["function"]["name"] == name]
    return spec["parameters"]


def test_instructor_tools_and_json_schema(serve, clients_python):
    out = run_client(clients_python, "run_instructor.py", serve.url)
    tools = out["TOOLS"]
    body = only(tools["sent"], "/v1/chat/completions")
    [tool] = body["tools"]
    assert body["tool_choice"] == {
        "type": "function",
        "function": {"name": tool["function"]["name"]},
    }
    arguments = json.loads(tools["raw"])
    jsonschema.validate(arguments, tool["function"]["parameters"])
    assert arguments == tools["city"]

    schema_mode = out["JSON_SCHEMA"]
    body = only(schema_mode["sent"], "/v1/chat/completions")
    assert body["response_format"]["type"] == "json_schema" and "tools" not in body
    content = json.loads(schema_mode["raw"])
    jsonschema.validate(content, body["response_format"]["json_schema"]["schema"])
    assert content == schema_mode["city"]


@pytest.fixture(scope="module")
def langchain(serve, clients_python) -> dict:
    return run_client(clients_python, "run_langchain.py", serve.url)


def test_langchain_structured_output_and_bound_tools(langchain):
    out = langchain
    body = only(out["json_schema"]["sent"], "/v1/chat/completions")
    assert body["response_format"]["type"] == "json_schema"
    jsonschema.validate(
        out["json_schema"]["parsed"], body["response_format"]["json_schema"]["schema"]
    )

    body = only(out["function_calling"]["sent"], "/v1/chat/completions")
    [tool] = body["tools"]
    assert body["tool_choice"]["function"]["name"] == tool["function"]["name"] == "City"
    jsonschema.validate(out["function_calling"]["parsed"], tool["function"]["parameters"])

    for choice, sent_choice in (
        ("get_weather", {"type": "function", "function": {"name": "get_weather"}}),
        ("required", "required"),
    ):
        result = out["tools_" + choice]
        body = only(result["sent"], "/v1/chat/completions")
        assert body["tool_choice"] == sent_choice
        calls = result["tool_calls"]
        assert calls and (len(calls) == 1 or choice == "required")  # named: exactly one
        for call in calls:
            assert call["name"] == "get_weather" and call["id"].startswith("call_")
            jsonschema.validate(call["args"], tool_schema(body, "get_weather"))


def test_langchain_required_calls_are_not_repeated(langchain):
    """docs/server.md: a call that repeats an earlier one of the same reply (same name, same
    arguments) ends the output there. The tiny model writes the same call twice, with the
    whitespace between its members changed, then another: a repeat all the same."""
    calls = [(c["name"], c["args"]) for c in langchain["tools_required"]["tool_calls"]]
    assert all(call not in calls[:i] for i, call in enumerate(calls))


def test_pydantic_ai_agent_calls_its_tool_then_gives_its_output(serve, clients_python):
    out = run_client(clients_python, "run_pydantic_ai.py", serve.url)
    first, second = (request["body"] for request in out["sent"])
    assert {r["path"] for r in out["sent"]} == {"/v1/chat/completions"}
    assert out["requests"] == 2
    assert first["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    [city] = out["calls"]
    jsonschema.validate({"city": city}, tool_schema(first, "get_weather"))
    # The tool's result went back to the model, whose next reply is the output tool's call.
    assert {"role": "tool", "tool_call_id": ANY, "content": "sunny"} in second["messages"]
    assert second["tool_choice"] == {"type": "function", "function": {"name": "final_result"}}
    jsonschema.validate(out["output"], tool_schema(second, "final_result"))


def test_openai_agents_sdk_on_chat_completions_and_responses(serve, clients_python):
    out = run_client(clients_python, "run_openai_agents.py", serve.url)
    for name, path in (("chat", "/v1/chat/completions"), ("responses", "/v1/responses")):
        run = out[name]
        assert run["items"] == ["tool_call_item", "tool_call_output_item", "message_output_item"]
        assert [r["path"] for r in run["sent"]] == [path, path]
        first, second = (r["body"] for r in run["sent"])
        [city] = run["calls"]
        if name == "chat":
            assert first["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
            jsonschema.validate({"city": city}, tool_schema(first, "get_weather"))
            assert second.get("tool_choice", "auto") == "auto"  # reset once the tool ran
            assert any(m["role"] == "tool" for m in second["messages"])
            schema = second["response_format"]["json_schema"]["schema"]
        else:
            assert first["tool_choice"] == {"type": "function", "name": "get_weather"}
            [tool] = first["tools"]
            jsonschema.validate({"city": city}, tool["parameters"])
            assert second.get("tool_choice", "auto") == "auto"
            assert any(item.get("type") == "function_call_output" for item in second["input"])
            schema = second["text"]["format"]["schema"]
        jsonschema.validate(run["output"], schema)


CHOICES = ["red", "green", "blue"]
YEAR = r"(19|20)\d\d"


@sgl.function
def program(s, question):
    """clients/run_sglang.py's program, in braid's SGLang idioms."""
    s += "Question: " + question + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=8, temperature=0, stop="\n")
    s += "\nColour: " + sgl.select("colour", choices=CHOICES)
    s += "\nYear: " + sgl.gen("year", max_tokens=8, temperature=0, regex=YEAR)


def test_sglang_runtime_endpoint_runs_as_braid_runs_the_program(serve, clients_python, model_path):
    out = run_client(clients_python, "run_sglang.py", serve.url)
    assert out["colour"] in CHOICES and re.fullmatch(YEAR, out["year"])
    from braid.interpreter import LocalBackend
    from braid.runtime import Engine

    engine = Engine(model=str(model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    try:
        # SGLang's gens are not healed; braid's programs heal by default (docs/programs.md).
        state = program.run(
            question="What colour is the sky?", backend=LocalBackend(engine), token_healing=False
        )
    finally:
        engine.shutdown()
    ours = {name: state[name] for name in ("answer", "colour", "year")}
    assert {name: out[name] for name in ours} == ours
    assert out["text"] == state.text()


QUIZ = [
    {"question": "What colour is the sky?", "choices": ["blue", "green", "red"], "answer": 0},
    {"question": "How many legs has a cat?", "choices": ["two", "four", "six"], "answer": 1},
    {"question": "Which is a fruit?", "choices": ["a stone", "a chair", "an apple"], "answer": 2},
    {"question": "What is ice?", "choices": ["frozen water", "hot sand", "a colour"], "answer": 0},
]
TASK = """task: braid_tiny_quiz
dataset_path: json
dataset_kwargs:
  data_files:
    test: quiz.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""


@pytest.mark.slow  # lm-eval's venv (torch, datasets, transformers...) takes ~150 s to make
@pytest.mark.timeout(900)
def test_lm_eval_local_completions_scores_as_the_model_does(serve, model_path, tmp_path):
    import torch
    import transformers

    python = peer_python("lm-eval")
    (tmp_path / "quiz.jsonl").write_text("".join(json.dumps(row) + "\n" for row in QUIZ))
    (tmp_path / "quiz.yaml").write_text(TASK)
    out = run_client(
        python, "run_lm_eval.py", serve.url, str(model_path), str(tmp_path), cwd=tmp_path
    )

    # Each continuation's loglikelihood, from transformers, tokenized as lm-eval does: the
    # whole text, split where the context's own tokens end.
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    def loglikelihood(context: str, continuation: str) -> float:
        whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
        start = len(tokenizer(context, add_special_tokens=False).input_ids)
        with torch.no_grad():
            logprobs = model(torch.tensor([whole])).logits[0].log_softmax(-1)
        return sum(float(logprobs[i - 1, whole[i]]) for i in range(start, len(whole)))

    samples = sorted(out["samples"], key=lambda s: s["doc_id"])
    assert len(samples) == len(QUIZ)
    correct = []
    for sample, row in zip(samples, QUIZ, strict=True):
        assert [c for _, c in sample["arguments"]] == [" " + c for c in row["choices"]]
        ours = [loglikelihood(ctx, cont) for ctx, cont in sample["arguments"]]
        assert sample["loglikelihoods"] == pytest.approx(ours, abs=1e-3)
        correct.append(float(max(range(len(ours)), key=ours.__getitem__) == row["answer"]))
        assert sample["acc"] == correct[-1]
    assert math.isclose(out["results"]["acc,none"], sum(correct) / len(correct))
