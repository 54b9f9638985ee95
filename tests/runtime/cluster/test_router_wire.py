"""What the front sends through SGLang's router (in SGLang's names) and what it sends to a
replica itself; and braid's server taking the fields the router writes into requests."""

from __future__ import annotations

import json

import pytest

from braid.runtime.cluster.router_wire import for_router, routing_text
from braid.runtime.server.wire import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    convert,
    openai_request,
)

# What sglang-router 0.3.2 forwarded for {"text": "hello", "sampling_params": {"max_new_tokens":
# 4, "sampling_seed": 4}, "rid": "r1"} (captured from the router by a recording worker).
ROUTED_GENERATE = {
    "text": "hello",
    "model": None,
    "sampling_params": {"max_new_tokens": 4, "sampling_seed": 4},
    "return_text_in_logprobs": False,
    "stream": False,
    "log_metrics": True,
    "return_hidden_states": False,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
    "rid": "r1",
}
ROUTED_CHAT_EXTRAS = {
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
}
# What it writes into completions.
COMPLETION_EXTRAS = ("no_stop_trim", "ignore_eos", "skip_special_tokens", "return_hidden_states")


def test_generate_goes_through_the_router_in_sglang_names():
    body = {
        "text": "hi",
        "stream": True,
        "sampling_params": {
            "max_tokens": 8,
            "min_tokens": 0,
            "seed": 3,
            "grammar": 'start: "a"',
            "json_schema": None,  # a RemoteBackend sends every field; null ones are absent
            "logit_bias": None,
        },
    }
    assert for_router("/generate", body, "tiny") == {
        "text": "hi",
        "stream": True,
        "sampling_params": {
            "max_new_tokens": 8,
            "min_new_tokens": 0,
            "sampling_seed": 3,
            "ebnf": 'start: "a"',
        },
    }
    schema = {"text": "hi", "sampling_params": {"json_schema": {"type": "object"}}}
    assert (
        for_router("/generate", schema, "tiny")["sampling_params"]["json_schema"]
        == '{"type": "object"}'
    )


@pytest.mark.parametrize(
    "path, body",
    [
        ("/generate", {"text": "hi", "sampling_params": {"stop_regex": "[0-9]"}}),
        ("/generate", {"text": "hi", "sampling_params": {"logit_bias": {"5": 1.0}}}),
        ("/generate", {"text": ["a", "b"]}),  # a batch
        ("/generate", {"input_ids": [[1, 2], [3]]}),
        ("/generate", {"text": "hi", "sampling_params": [{}]}),
        ("/generate", {"text": "hi", "sampling_params": {"max_tokens": 1, "max_new_tokens": 1}}),
        ("/v1/completions", {"prompt": [1, 2, 3]}),  # token ids
        ("/v1/chat/completions", {"messages": [], "stop_regex": "x"}),
        ("/v1/chat/completions", {"messages": [], "grammar": "start: x"}),
        ("/v1/chat/completions", {"messages": [], "choices": ["a"]}),
        ("/v1/chat/completions", {"messages": [], "json_schema": "{}"}),
        # A salt: the router drops it from chat (the cache then shared), routes by text alone.
        ("/v1/chat/completions", {"messages": [], "cache_salt": "k1"}),
        ("/v1/completions", {"prompt": "hi", "cache_salt": "k1"}),
        ("/generate", {"text": "hi", "cache_salt": "k1"}),
    ],
)
def test_requests_the_router_would_change_go_to_a_replica(path, body):
    assert for_router(path, body, "tiny") is None


def test_openai_requests_go_through_the_router():
    chat = {"messages": [{"role": "user", "content": "x"}], "model": "tiny"}
    assert for_router("/v1/chat/completions", chat, "tiny") is chat
    completion = {"prompt": ["a", "b"], "json_schema": {"type": "object"}, "stop_regex": "x"}
    assert for_router("/v1/completions", completion, "tiny") == {
        **completion,
        "json_schema": json.dumps({"type": "object"}),
        "model": "tiny",  # the router requires one
    }


def test_braid_takes_what_the_router_writes_into_requests():
    request = convert(ROUTED_GENERATE, GenerateRequest)
    assert request.params(0, 1).seed == 4
    messages = [{"role": "user", "content": "x"}]
    openai_request({"messages": messages, **ROUTED_CHAT_EXTRAS}, ChatCompletionRequest, 512)
    extras = {k: v for k, v in ROUTED_CHAT_EXTRAS.items() if k in COMPLETION_EXTRAS}
    openai_request({"prompt": "x", **extras}, CompletionRequest, 512)
    with pytest.raises(BadRequest, match="return_hidden_states must be false"):
        convert({**ROUTED_GENERATE, "return_hidden_states": True}, GenerateRequest)
    with pytest.raises(BadRequest, match="continue_final_message must be false"):
        openai_request(
            {"messages": messages, "continue_final_message": True}, ChatCompletionRequest, 512
        )
    with pytest.raises(BadRequest, match="no_stop_trim must be False"):
        convert({"text": "x", "sampling_params": {"no_stop_trim": True}}, GenerateRequest).params(
            0, 1
        )


def test_a_salted_request_has_affinity_under_its_salt_only():
    chat = {"messages": [{"role": "user", "content": "x"}]}
    texts = {
        routing_text("/v1/chat/completions", {**chat, "cache_salt": salt})
        for salt in ("a", "b", None)
    }
    assert len(texts) == 3
    assert routing_text("/v1/completions", {"prompt": "bc", "cache_salt": "a"}) != routing_text(
        "/v1/completions", {"prompt": "c", "cache_salt": "ab"}
    )
