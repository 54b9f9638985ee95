"""Documents that close in harmony tool calls: near the end of its room a call's arguments
keep only tokens that leave room to finish them and `<|call|>`."""

from __future__ import annotations

import pytest
import transformers
from reasoning_models import family_tokenizer

from braid.grammars.constraints import ToolCalls, ToolSchema
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
PREFIX = ' to=functions.weather<|channel|>commentary json<|message|>{"city":"Par'


@pytest.fixture(scope="module")
def tok(default_model_path, tmp_path_factory):
    path = family_tokenizer("gpt_oss", default_model_path, tmp_path_factory.mktemp("gpt-oss"))
    return transformers.AutoTokenizer.from_pretrained(path)


def test_arguments_close_in_time_for_the_call_token(tok):
    call = tok.convert_tokens_to_ids("<|call|>")
    eos = {tok.convert_tokens_to_ids("<|return|>"), call}
    service = GrammarService(tok, eos, EngineConfig(), harmony=True)
    try:
        calls = ToolCalls((ToolSchema.of("weather", WEATHER, "tools[0]"),))
        grammar = service.prepare(SamplingParams(tool_calls=calls)).result().grammar
    finally:
        service.close()
    m = grammar.matcher()
    for t in tok.encode(PREFIX, add_special_tokens=False):
        assert m.accept_token(t)
    row = allocate_bitmask(1, len(tok))[0]
    assert not m.fill_bitmask_within(row, 50)  # room enough: the plain mask
    free = set(allowed_token_ids(row))
    # Two tokens left: one to close the arguments, one for <|call|>.
    assert m.fill_bitmask_within(row, 2)
    kept = allowed_token_ids(row)
    assert kept and set(kept) < free and call not in kept
    after = allocate_bitmask(1, len(tok))[0]
    for t in kept:
        assert m.accept_token(t)
        m.fill_bitmask(after)
        assert call in allowed_token_ids(after), tok.decode([t])
        m.rollback(1)
