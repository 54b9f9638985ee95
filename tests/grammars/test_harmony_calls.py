"""Tool calls in harmony's format (grammars/harmony_calls.py), compiled by the engine's
grammar service for a harmony tokenizer: a call's name, channel header, arguments and
`<|call|>`, or (where the reply may be text) the final channel's text and `<|return|>`, each
token checked against the mask before it, with rollback across the parts."""

from __future__ import annotations

import json

import jsonschema
import pytest
import transformers
from reasoning_models import family_tokenizer

from braid.grammars.constraints import AnyText, JsonSchema, ToolCalls, ToolSchema
from braid.grammars.harmony_calls import CHANNEL
from braid.grammars.matcher import allocate_bitmask, allowed_token_ids
from braid.runtime.config import EngineConfig
from braid.runtime.constraint.service import GrammarService
from braid.runtime.protocol.sampling_params import SamplingParams

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = (
    ToolSchema.of("weather", WEATHER, "tools[0]"),
    ToolSchema.of("weather_alerts", {"type": "object"}, "tools[1]"),
)
CALL = ' to=functions.weather<|channel|>commentary json<|message|>{"city":"Paris"}<|call|>'


@pytest.fixture(scope="module")
def tok(default_model_path, tmp_path_factory):
    path = family_tokenizer("gpt_oss", default_model_path, tmp_path_factory.mktemp("gpt-oss"))
    return transformers.AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def service(tok):
    eos = {tok.convert_tokens_to_ids("<|return|>"), tok.convert_tokens_to_ids("<|call|>")}
    svc = GrammarService(tok, eos, EngineConfig(), harmony=True)
    yield svc
    svc.close()


def grammar(service, calls: ToolCalls):
    return service.prepare(SamplingParams(tool_calls=calls)).result().grammar


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def walk(matcher, tokens: list[int], size: int) -> list[set[int]]:
    masks = []
    for t in tokens:
        row = allocate_bitmask(1, size)[0]
        matcher.fill_bitmask(row)
        masks.append(set(allowed_token_ids(row)))
        assert t in masks[-1], f"token {t} is masked"
        assert matcher.accept_token(t)
    return masks


def test_a_call_is_a_name_a_header_arguments_and_call(tok, service):
    m = grammar(service, ToolCalls(TOOLS)).matcher()
    tokens = ids(tok, CALL)
    masks = walk(m, tokens, len(tok))
    assert m.is_terminated()
    call, ret = tok.convert_tokens_to_ids("<|call|>"), tok.convert_tokens_to_ids("<|return|>")
    header = tokens.index(tok.convert_tokens_to_ids("<|channel|>"))
    after = header + len(ids(tok, CHANNEL))
    # After "weather" the name may go on ("_alerts") or end: the header's first token.
    assert tokens[header] in masks[header] and len(masks[header]) > 1
    assert all(len(mask) == 1 for mask in masks[header + 1 : after])  # forced
    # After the arguments: the call's end, or whitespace after the JSON (bounded).
    assert call in masks[-1] and ret not in set().union(*masks)
    assert all(tok.decode([t]).isspace() for t in masks[-1] - {call})
    arguments = tok.decode(tokens[after:-1])
    jsonschema.validate(json.loads(arguments), WEATHER)


def test_a_text_reply_where_the_reply_may_be_text(tok, service):
    free = grammar(service, ToolCalls(TOOLS, text=AnyText())).matcher()
    walk(free, ids(tok, "<|channel|>final<|message|>Sunny, I think.<|return|>"), len(tok))
    assert free.is_terminated()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    held = grammar(service, ToolCalls(TOOLS, text=JsonSchema.of(schema))).matcher()
    masks = walk(held, ids(tok, '<|channel|>final<|message|>{"ok":true}<|return|>'), len(tok))
    ret = tok.convert_tokens_to_ids("<|return|>")
    assert ret in masks[-1] and all(tok.decode([t]).isspace() for t in masks[-1] - {ret})
    calls_only = grammar(service, ToolCalls(TOOLS)).matcher()
    assert not calls_only.accept_token(tok.convert_tokens_to_ids("<|channel|>"))


def test_rollback_across_the_parts(tok, service):
    m = grammar(service, ToolCalls(TOOLS, text=AnyText())).matcher()
    tokens = ids(tok, CALL)
    masks = walk(m, tokens, len(tok))
    for back in (1, 3, 6, len(tokens)):
        m.rollback(back)
        row = allocate_bitmask(1, len(tok))[0]
        m.fill_bitmask(row)
        assert set(allowed_token_ids(row)) == masks[len(tokens) - back]
        walk(m, tokens[len(tokens) - back :], len(tok))
    assert m.is_terminated()
