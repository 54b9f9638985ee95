"""Thinking budgets on the conversational routes: a budget of N cuts the thought at N tokens
and the answer after it still holds to the schema; every budget field of every API gives the
engine the budget the docs say (efforts by their table); two budgets that disagree, or a
budget for a model that does not think, are a 400 naming the fields; thinking off."""

from __future__ import annotations

import httpx
import pytest
import reasoning_cases
from reasoning_cases import ANSWER, CHAT_FORMAT, THOUGHT, given_params
from reasoning_models import QUESTION, prompt_ids

served = reasoning_cases.served

REQUEST = dict(model="tiny", messages=QUESTION, max_tokens=40, temperature=0)
# The documented mapping of reasoning efforts to thinking budgets (docs/server.md).
EFFORTS = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384}


def chat(served, **body) -> httpx.Response:
    return httpx.post(served.url + "/v1/chat/completions", json=REQUEST | body, timeout=60)


@pytest.mark.parametrize("mode", ["hard", "soft"])
@pytest.mark.parametrize("budget", [1, 3])
@pytest.mark.parametrize("name", ["qwen3", "r1", "gpt_oss"])
def test_a_budget_of_n_cuts_the_thought_at_n_tokens_and_the_answer_holds(
    served, name, budget, mode
):
    s = served(name)
    whole = chat(s, response_format=CHAT_FORMAT).json()
    cut = chat(
        s, response_format=CHAT_FORMAT, thinking_token_budget=budget, thinking_budget_mode=mode
    ).json()
    message = cut["choices"][0]["message"]
    assert message["content"] == ANSWER
    thought_ids = s.tokens(THOUGHT)
    reasoning = lambda r: r["usage"]["completion_tokens_details"]["reasoning_tokens"]  # noqa: E731
    if mode == "hard":  # the end marker forced at the budget
        assert message["reasoning_content"] == s.tokenizer.decode(thought_ids[:budget]).strip()
        assert reasoning(cut) == reasoning(whole) - (len(thought_ids) - budget)
    else:  # closed at the budget at the latest
        assert THOUGHT.startswith(message["reasoning_content"])
        assert reasoning(cut) <= reasoning(whole) - (len(thought_ids) - budget)


@pytest.mark.parametrize(
    "path,body,budget",
    [
        ("/v1/chat/completions", {"thinking_token_budget": 7}, 7),
        ("/v1/chat/completions", {"thinking_budget": 7}, 7),
        ("/v1/chat/completions", {"max_thinking_tokens": 7}, 7),
        ("/v1/chat/completions", {"custom_params": {"thinking_budget": 7}}, 7),
        ("/v1/chat/completions", {}, None),  # the model thinks as long as it likes
        *[("/v1/chat/completions", {"reasoning_effort": e}, b) for e, b in EFFORTS.items()],
        *[("/v1/responses", {"reasoning": {"effort": e}}, b) for e, b in EFFORTS.items()],
        ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 7}}, 7),
        ("/v1/messages", {"thinking": {"type": "disabled"}}, 0),
        ("/v1/messages", {"thinking": {"type": "adaptive"}}, None),
    ],
)
def test_each_budget_field_gives_the_engine_its_budget(served, monkeypatch, path, body, budget):
    s = served("qwen3")
    given = given_params(monkeypatch, s)
    if path == "/v1/responses":
        body = {"model": "tiny", "input": QUESTION, "max_output_tokens": 40} | body
    elif path == "/v1/messages":
        body = {"model": "tiny", "messages": QUESTION, "max_tokens": 40} | body
    else:
        body = REQUEST | body
    r = httpx.post(s.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    [params] = given
    if budget == 0:  # thinking off: Qwen3's template closes the thought, nothing is left to run
        assert (params.reasoning, params.thinking_budget) == (False, None)
    else:
        assert params.reasoning and params.thinking_budget == budget


def test_thinking_off_where_the_prompt_still_opens_the_thought_ends_it_at_once(served, monkeypatch):
    s = served("r1")  # R1's prompt opens <think> whatever the template is told
    given = given_params(monkeypatch, s)
    out = chat(s, reasoning_effort="none", response_format=CHAT_FORMAT).json()
    assert (given[0].reasoning, given[0].thinking_budget) == (True, 0)
    message = out["choices"][0]["message"]
    assert message["content"] == ANSWER and not message["reasoning_content"]
    end = len(s.tokens("</think>"))
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] == end


def test_budget_mode_and_the_request_level_switch(served, monkeypatch):
    s = served("qwen3")
    given = given_params(monkeypatch, s)
    assert chat(s, thinking_budget=5, thinking_budget_mode="hard").status_code == 200
    off = chat(s, reasoning=False)  # as if the model had no reasoning format: nothing split
    assert (given[0].thinking_budget, given[0].thinking_budget_mode) == (5, "hard")
    assert not given[1].reasoning
    message = off.json()["choices"][0]["message"]
    assert message["content"] == f"<think>{THOUGHT}</think>{ANSWER}"
    assert "reasoning_content" not in message


@pytest.mark.parametrize(
    "body,named",
    [
        (
            {"thinking_token_budget": 5, "thinking_budget": 6},
            ("thinking_token_budget", "thinking_budget"),
        ),
        (
            {"max_thinking_tokens": 5, "reasoning_effort": "low"},
            ("max_thinking_tokens", "reasoning_effort"),
        ),
        (
            {"thinking_token_budget": 5, "custom_params": {"thinking_budget": 9}},
            ("thinking_token_budget", "custom_params.thinking_budget"),
        ),
    ],
)
def test_two_budgets_that_disagree_are_a_400_naming_both(served, body, named):
    r = chat(served("qwen3"), **body)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert all(field in message for field in named), message


def test_budgets_that_agree_are_one(served, monkeypatch):
    s = served("qwen3")
    given = given_params(monkeypatch, s)
    r = chat(s, thinking_token_budget=1024, reasoning_effort="low", max_thinking_tokens=1024)
    assert r.status_code == 200 and given[0].thinking_budget == 1024


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/v1/chat/completions", {"thinking_token_budget": 5}, "thinking_token_budget"),
        ("/v1/chat/completions", {"reasoning_effort": "high"}, "reasoning_effort"),
        ("/v1/chat/completions", {"custom_params": {"thinking_budget": 5}}, "custom_params"),
        ("/v1/responses", {"reasoning": {"effort": "low"}}, "reasoning.effort"),
        ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 5}}, "budget_tokens"),
    ],
)
def test_a_budget_for_a_model_that_does_not_think_is_a_400_naming_it(served, path, body, field):
    s = served("qwen3_plain")
    if path == "/v1/responses":
        body = {"model": "tiny", "input": "Hi", "max_output_tokens": 4} | body
    elif path == "/v1/messages":
        body = {"model": "tiny", "messages": QUESTION, "max_tokens": 4} | body
    else:
        body = REQUEST | body
    r = httpx.post(s.url + path, json=body, timeout=60)
    assert r.status_code == 400
    assert field in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"custom_params": {"thinking_budget": -1}},
        {"custom_params": {"temperature_schedule": 1}},
        {"thinking_token_budget": -1},
        {"reasoning_effort": "extreme"},
    ],
)
def test_malformed_thinking_fields_are_a_400(served, body):
    r = chat(served("qwen3"), **body)
    assert r.status_code == 400, r.text


@pytest.mark.parametrize(
    "body",
    [
        {"reasoning_effort": "none"},
        {"thinking_token_budget": 0},
        {"chat_template_kwargs": {"enable_thinking": False}},
    ],
)
def test_thinking_off_renders_the_templates_no_thinking_prompt(served, body):
    # The model scripted after Qwen3's enable_thinking=false prompt answers at once.
    s = served("qwen3_off")
    out = chat(s, response_format=CHAT_FORMAT, **body).json()
    assert out["usage"]["prompt_tokens"] == len(s.prompt_ids)
    message = out["choices"][0]["message"]
    assert message["content"] == ANSWER and not message["reasoning_content"]
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_the_requests_own_template_variables_win(served):
    s = served("qwen3_off")
    kwargs = {"enable_thinking": True}
    out = chat(s, reasoning_effort="none", chat_template_kwargs=kwargs).json()
    thinking_prompt = prompt_ids(s.tokenizer, QUESTION, enable_thinking=True)
    assert out["usage"]["prompt_tokens"] == len(thinking_prompt) != len(s.prompt_ids)
