"""Token healing end to end on the tiny model: the healed first token against transformers'
logits, greedy equality with the unhealed prompt under a "starts with p" constraint, the
switch, prompts not healed, programs and the server's field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import torch
import transformers

from braid import assistant, gen, program, user
from braid.interpreter import LocalBackend, OpenAIBackend, RemoteBackend
from braid.runtime import Engine, SamplingParams
from tests.conftest import LiveServer

PROMPT = "The capital of France is "


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    # Without jump-forward a constraint "starts with ' '" leaves the model its own tokens
    # (else the forced space would be fed as a token of its own).
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        jump_forward=False,
    )
    yield engine
    engine.shutdown()


def greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=fields.pop("max_tokens", 8), **fields)


def test_healed_first_token_is_the_reference_argmax(engine, tiny_model_path):
    """The first token is the argmax, among the tokens that start with the removed " ", of
    transformers' logits after the prompt without its last token."""
    ids = engine.encode(PROMPT)
    vocab = engine.grammars.vocab
    removed = vocab.token_bytes[ids[-1]]
    assert removed == b" "
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]])).logits[0, -1]
    candidates = [i for i, b in enumerate(vocab.token_bytes) if b and b.startswith(removed)]
    best = max(candidates, key=lambda i: logits[i].item())
    out = engine.generate(PROMPT, greedy(max_tokens=1, token_healing=True))
    assert out.token_ids == [best]
    assert out.text == vocab.token_bytes[best][len(removed) :].decode()
    assert out.meta["prompt_tokens"] == len(ids) - 1  # what was prefilled


def test_healed_equals_unhealed_prompt_held_to_start_with_p(engine):
    healed = engine.generate(PROMPT, greedy(token_healing=True))
    held = engine.generate(PROMPT[:-1], greedy(regex=r" (.|\n)*"))
    assert healed.token_ids == held.token_ids
    assert held.text.startswith(" ") and healed.text == held.text[1:]


def test_composes_with_a_regex(engine):
    pattern = r"[A-Z][a-z]{2,6}\."
    healed = engine.generate(PROMPT, greedy(regex=pattern, token_healing=True))
    held = engine.generate(PROMPT[:-1], greedy(regex=" " + pattern))
    assert healed.token_ids == held.token_ids
    assert healed.text == held.text[1:]


def test_composes_with_json(engine):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "boolean"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    out = engine.generate(
        "Answer in JSON: ", greedy(json_schema=schema, max_tokens=64, token_healing=True)
    )
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(out.text), schema)


def test_off_gives_todays_output(engine):
    today = engine.generate(PROMPT, greedy())
    off = engine.generate(PROMPT, greedy(token_healing=False))
    assert off.token_ids == today.token_ids
    assert off.meta["prompt_tokens"] == len(engine.encode(PROMPT))


def test_not_healed(engine):
    on = greedy(token_healing=True)
    ids = engine.encode(PROMPT)
    assert engine.prompt_ids(PROMPT, on) == (ids[:-1], b" ")
    assert engine.prompt_ids(ids, on) == (ids, b"")  # token ids are never healed
    special = PROMPT + "<|im_end|>"
    assert engine.prompt_ids(special, on) == (engine.encode(special), b"")
    logprobs = greedy(token_healing=True, prompt_logprobs_from=1)
    assert engine.prompt_ids(PROMPT, logprobs)[1] == b""


@program
def capital(s, **sampling):
    s += PROMPT
    s += gen("x", max_tokens=6, temperature=0, **sampling)


def test_program_gens_heal_by_default(engine):
    backend = LocalBackend(engine)
    healed = engine.generate(PROMPT, greedy(max_tokens=6, token_healing=True))
    unhealed = engine.generate(PROMPT, greedy(max_tokens=6))
    assert healed.token_ids != unhealed.token_ids  # the test can tell them apart
    assert capital.run(backend=backend)["x"] == healed.text
    assert capital.run(backend=backend, token_healing=False)["x"] == unhealed.text


def test_remote_backend_heals_as_the_local_one(engine):
    """The field travels to /generate; with return_logprobs too (the healed prompt's
    listing once failed the request)."""
    want = greedy(max_tokens=6, token_healing=True, logprobs=True)
    healed = engine.generate(PROMPT, want)
    server = LiveServer(engine)
    try:
        state = capital.run(backend=RemoteBackend(server.url), return_logprobs=True)
    finally:
        server.stop()
    assert state["x"] == healed.text
    assert state.meta("x")["token_ids"] == healed.token_ids
    assert state.meta("x")["logprobs"] == pytest.approx(healed.meta["logprobs"], abs=1e-5)


def test_openai_backend_does_not_heal(engine):
    """It sends text to an API that does not heal: by default its gens run unhealed, and a
    gen that asks for healing fails, naming it."""
    unhealed = engine.generate(PROMPT, greedy(max_tokens=6))
    server = LiveServer(engine)
    try:
        backend = OpenAIBackend(server.url + "/v1", model="tiny")
        assert capital.run(backend=backend)["x"] == unhealed.text
        with pytest.raises(ValueError, match="token_healing=True, but OpenAIBackend"):
            capital.run(backend=backend, token_healing=True)
    finally:
        server.stop()


def test_gen_after_a_role_opening_is_not_healed(engine):
    @program
    def chat(s):
        s += user("Hi there ")
        s += assistant(gen("x", max_tokens=6, temperature=0, token_healing=True))

    backend = LocalBackend(engine)
    state = chat.run(backend=backend)
    after = state["x"] + backend.chat_template.end("assistant")
    assert state.text().endswith(after)
    prompt = state.text()[: -len(after)]
    assert state["x"] == engine.generate(prompt, greedy(max_tokens=6)).text
    assert state["x"] != engine.generate(prompt, greedy(max_tokens=6, token_healing=True)).text


def test_server_field(engine):
    server = LiveServer(engine)
    try:
        want = engine.generate(PROMPT, greedy(token_healing=True)).text
        body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        body["sampling_params"]["token_healing"] = True
        got = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
        assert got["text"] == want
        assert got["meta_info"]["prompt_tokens"] == len(engine.encode(PROMPT)) - 1
        completion = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "token_healing": True}
        got = httpx.post(f"{server.url}/v1/completions", json=completion, timeout=60).json()
        assert got["choices"][0]["text"] == want
        chat = {"messages": [{"role": "user", "content": "hi"}], "token_healing": True}
        refused = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60)
        assert refused.status_code == 400 and "token_healing" in refused.text
    finally:
        server.stop()


@pytest.mark.model
def test_default_model_heals_the_capital_of_france():
    """The issue's case: after a trailing space the default model writes "21st" unhealed;
    healed, it writes what it writes after the prompt without the space, less that space."""
    engine = Engine(max_kv_tokens=512)
    try:
        params = greedy(max_tokens=8)
        without_space = engine.generate(PROMPT[:-1], params).text
        assert without_space.startswith(" Paris")
        healed = engine.generate(PROMPT, greedy(max_tokens=8, token_healing=True)).text
        assert healed[:5] == without_space[1:6] == "Paris"  # the first word: "Paris." both
    finally:
        engine.shutdown()


def test_generate_lists_the_logprobs_of_a_healed_request(engine, tiny_model_path):
    """/generate with return_logprob heals: the prompt listing (SGLang's default, the last
    token) is of the tokens prefilled, against transformers' logprob; the output's, from the
    re-spelling first token on, the engine's own for the healed request. An explicit
    logprob_start_len asks for the prompt as given: a 400 naming both."""
    ids = engine.encode(PROMPT)
    prefilled = ids[:-1]
    healed = engine.generate(PROMPT, greedy(token_healing=True, logprobs=True))
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        reference = model(torch.tensor([prefilled])).logits[0].log_softmax(-1)
    want = reference[-2, prefilled[-1]].item()
    body = {
        "text": PROMPT,
        "sampling_params": {"temperature": 0, "max_new_tokens": 8, "token_healing": True},
        "return_logprob": True,
    }
    server = LiveServer(engine)
    try:
        reply = httpx.post(f"{server.url}/generate", json=body, timeout=60)
        refused = httpx.post(
            f"{server.url}/generate", json={**body, "logprob_start_len": 0}, timeout=60
        )
    finally:
        server.stop()
    assert reply.status_code == 200, reply.text
    got = reply.json()
    assert got["text"] == healed.text
    info = got["meta_info"]
    assert info["prompt_tokens"] == len(prefilled)
    [(lp, token, _)] = info["input_token_logprobs"]
    assert token == prefilled[-1] and lp == pytest.approx(want, abs=1e-4)
    output = info["output_token_logprobs"]
    assert [t for _, t, _ in output] == healed.token_ids
    assert [lp for lp, _, _ in output] == pytest.approx(healed.meta["logprobs"], abs=1e-5)
    assert refused.status_code == 400
    assert "token_healing" in refused.text and "logprob_start_len" in refused.text
