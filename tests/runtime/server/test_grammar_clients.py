"""Clients that send grammars in their own dialects, for real against a braid server: guidance
0.3's SglangModel and VLLMModel (every select, regex and json in llguidance's lark), outlines'
from_sglang and from_vllm CFG (lark under SGLang's `ebnf` and vLLM's
`structured_outputs.grammar`), and GBNF in `grammar` as llama.cpp's clients send it. What the
model wrote is checked against the grammar's reference (`re`, lark, jsonschema)."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import lark
import openai
import pytest

from braid.runtime import Engine
from tests.conftest import LiveServer

guidance = pytest.importorskip("guidance")
outlines = pytest.importorskip("outlines")

# ASCII names: guidance rebuilds a chunk of several tokens from their token strings, which
# cannot hold half a character (docs/server.md#grammar-dialects).
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z]{1,6}$"},
        "age": {"type": "integer", "minimum": 1, "maximum": 99},  # braid writes -0 for >= 0
    },
    "required": ["name", "age"],
}
# Recursive, but bounded (a random model writes until max_tokens: every text must end in
# time).
ARITHMETIC = """
?start: expr
?expr: term (("+" | "-") term)~0..2
?term: NUMBER | "(" inner ")"
?inner: NUMBER ("+" NUMBER)~0..1
NUMBER: /[0-9]{1,2}/
"""


@pytest.fixture(scope="module")
def server(tiny_model_path):
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    live = LiveServer(engine)
    yield live
    live.stop()
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.mark.parametrize("kind", ["SglangModel", "VLLMModel"])
def test_guidance_programs_select_regex_and_json(server, kind):
    from guidance import assistant, gen, select, user
    from guidance import json as gjson
    from guidance.models import experimental

    model = getattr(experimental, kind)
    lm = model("tiny", base_url=server.url + "/v1", api_key="unused", echo=False)
    with user():
        lm += "Is the sky blue? Then a number."
    with assistant():
        lm += select(["yes", "no"], name="yn") + ", " + gen("n", regex=r"[0-9]{1,3}") + "."
    assert lm["yn"] in ("yes", "no") and re.fullmatch(r"[0-9]{1,3}", lm["n"])
    with user():
        lm += "Now a person."
    with assistant():
        lm += gjson("person", schema=PERSON, max_tokens=40)
    jsonschema.validate(json.loads(lm["person"]), PERSON)


def test_guidance_gen_with_max_tokens_and_stop_bounds_the_reply(client):
    """guidance writes gen(max_tokens, stop) as rule attributes (VLLMModel sends them so);
    braid takes them as the reply's. guidance's own matcher cannot read a stopped capture
    back (the stop text is hidden, as llguidance hides it), so the reply is checked here."""
    from guidance import gen

    grammar = gen("said", max_tokens=6, stop="e").ll_grammar()
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Say something."}],
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    assert out.usage.completion_tokens <= 6
    assert "e" not in out.choices[0].message.content
    assert out.choices[0].finish_reason in ("stop", "length")


def test_outlines_cfg_through_sglang_and_vllm(server):
    import outlines
    from outlines.types import CFG

    reference = lark.Lark(ARITHMETIC, parser="earley")
    for connect in (outlines.from_sglang, outlines.from_vllm):
        model = connect(openai.OpenAI(base_url=server.url + "/v1", api_key="unused"), "tiny")
        text = model("Write a sum:", CFG(ARITHMETIC), max_tokens=40)
        reference.parse(text)  # raises unless the text is in the grammar's language


@pytest.mark.parametrize("field", ["grammar", "ebnf", "guided_grammar"])
def test_gbnf_on_chat_and_completions(server, field):
    gbnf = 'root ::= answer ("," answer){0,2}\nanswer ::= "yes" | "no" | [0-9]{1,2}\n'
    language = r"(yes|no|[0-9]{1,2})(,(yes|no|[0-9]{1,2})){0,2}"
    chat = {"messages": [{"role": "user", "content": "List."}], "max_tokens": 12, field: gbnf}
    r = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 200, r.text
    assert re.fullmatch(language, r.json()["choices"][0]["message"]["content"])
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "List:", "max_tokens": 12, field: gbnf},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert re.fullmatch(language, r.json()["choices"][0]["text"])


def test_sglang_native_ebnf_takes_gbnf(server):
    sampling = {"max_new_tokens": 8, "ebnf": 'root ::= "ok" | "no"'}
    body = {"text": "Answer:", "sampling_params": sampling}
    r = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["text"] in ("ok", "no")


def test_a_grammar_braid_cannot_read_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError, match="lookahead"):
        client.completions.create(
            model="tiny", prompt="x", max_tokens=2, extra_body={"ebnf": 'root ::= "a" (= "b")'}
        )
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(
            model="tiny",
            prompt="x",
            max_tokens=2,
            extra_body={
                "structured_outputs": {
                    "grammar": '%llguidance {}\nstart: "a" t\nt[temperature=0.5]: /b+/\n'
                }
            },
        )
