"""What OpenAI SDKs and the frameworks on them send beyond the basics, through the official
openai client: logit_bias, fields that change nothing here, best_of, the model's name."""

from __future__ import annotations

import argparse

import httpx
import openai
import pytest
from conftest import LiveServer

from braid import gen, program
from braid.interpreter import LocalBackend
from braid.runtime import SamplingParams
from braid.runtime.server import serve

PROMPT = "Once upon"


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def first_token(client, **extra) -> str:
    out = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=1, temperature=0, logprobs=0, **extra
    )
    [token] = out.choices[0].logprobs.tokens
    return token


def test_logit_bias_moves_the_greedy_pick(engine, client):
    greedy = engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=1)).token_ids[0]
    assert first_token(client) == engine.tokenizer.decode([greedy])
    # -100 on the greedy token: another one wins.
    assert first_token(client, logit_bias={str(greedy): -100}) != engine.tokenizer.decode([greedy])
    # A big bias on an unlikely token makes it the pick, on both OpenAI routes.
    target = engine.tokenizer.encode(" zebra", add_special_tokens=False)[0]
    assert target != greedy
    assert first_token(client, logit_bias={str(target): 100}) == engine.tokenizer.decode([target])
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=1,
        temperature=0,
        logit_bias={str(target): 100},
    )
    assert chat.choices[0].message.content == engine.tokenizer.decode([target])
    # The engine and gen take it as a SamplingParams field (ids as ints).
    params = SamplingParams(temperature=0, max_tokens=3, logit_bias={target: 100})
    assert engine.generate(PROMPT, params).token_ids == [target] * 3

    @program
    def biased(s):
        s += PROMPT
        # Unhealed: healing would make the first token re-spell the prompt's last one.
        s += gen("word", max_tokens=2, temperature=0, logit_bias={target: 100}, token_healing=False)

    state = biased.run(backend=LocalBackend(engine))
    assert state["word"] == engine.tokenizer.decode([target, target])


@pytest.mark.parametrize(
    "bias,message",
    [
        ({"5": 101}, r"logit_bias values must be in \[-100, 100\]"),
        ({"999999": 1}, r"logit_bias token ids must be in \[0, "),
        ({"-1": 1}, "logit_bias token ids"),
        ({"a": 1}, "logit_bias keys must be token ids"),
    ],
)
def test_bad_logit_bias_is_a_400_naming_it(client, bias, message):
    with pytest.raises(openai.BadRequestError, match=message):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, logit_bias=bias)


def test_logit_bias_values_are_checked_by_sampling_params():
    with pytest.raises(ValueError, match="logit_bias values"):
        SamplingParams(logit_bias={5: float("nan")})


def test_sdk_fields_that_change_nothing_are_accepted(engine, client):
    plain = dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6)
    reference = client.chat.completions.create(**plain, temperature=0)
    out = client.chat.completions.create(
        **plain,
        temperature=0,
        store=False,
        metadata={"run": "test"},
        service_tier="auto",
        user="someone",
        reasoning_effort="none",  # thinking off: a model that never thinks answers the same
        parallel_tool_calls=True,
        frequency_penalty=0,
        presence_penalty=0,
        seed=1,
        extra_body={"prompt_cache_key": "k", "safety_identifier": "s"},
    )
    assert out.choices[0].message.content == reference.choices[0].message.content
    assert out.choices[0].finish_reason == reference.choices[0].finish_reason


def test_best_of_returns_the_samples_with_the_best_logprob_per_token(client):
    request = dict(model="tiny", prompt=PROMPT, max_tokens=6, seed=5, logprobs=0)
    drawn = client.completions.create(**request, n=4)  # the samples best_of draws
    best = client.completions.create(**request, n=2, best_of=4)

    def mean(choice) -> float:
        lps = choice.logprobs.token_logprobs
        return sum(lps) / len(lps)

    ranked = sorted(drawn.choices, key=mean, reverse=True)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert best.usage.completion_tokens == drawn.usage.completion_tokens  # all four count
    same = client.completions.create(**request, n=2, best_of=2)
    assert len(same.choices) == 2
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(**request, n=3, best_of=2)
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(**request, best_of=3, stream=True)


def test_models_by_id_and_a_wrong_model(engine, server, client):
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("gpt-4o")
    assert error.value.code == "model_not_found"
    assert error.value.body["type"] == "invalid_request_error"
    assert "gpt-4o" in error.value.body["message"]
    with pytest.raises(openai.NotFoundError, match="model_not_found|gpt-4o"):
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="Hi", max_tokens=1)
    r = httpx.get(server.url + "/v1/models/org/some-model")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # Without a model named, the served one answers (raw HTTP: the SDK always sends one).
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200

    lenient = LiveServer(engine, accept_any_model=True)
    try:
        any_client = openai.OpenAI(base_url=lenient.url + "/v1", api_key="unused", max_retries=0)
        out = any_client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
        assert out.model == "gpt-4o"  # the name the request gave
        assert any_client.models.retrieve("gpt-4o").id == "gpt-4o"
    finally:
        lenient.stop()


def test_serve_has_the_accept_any_model_flag():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    serve.add_parser(commands)
    assert parser.parse_args(["serve", "--accept-any-model"]).accept_any_model
    assert not parser.parse_args(["serve"]).accept_any_model
    assert "hard-code" in commands.choices["serve"].format_help()
