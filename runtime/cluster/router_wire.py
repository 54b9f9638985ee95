"""Which requests SGLang's router (sglang-router 0.3) forwards with nothing lost, and braid's
field names turned into the SGLang names it keeps.

The router parses each request into its own typed structs and sends those on, so a field it
does not know is dropped without a word: on /generate every sampling field outside SGLang's
own list (braid's `stop_regex`, `logit_bias`, `choices`), on chat completions braid's extra
fields (`stop_regex`, `choices`, `grammar`, `json_schema`, `close_documents`). It also
refuses what its types cannot hold: batches on /generate, token-id prompts on
/v1/completions, a `json_schema` given as an object. The front sends such requests to a
replica itself (`for_router` gives None), so no field is ever lost and nothing braid accepts
is refused.
"""

from __future__ import annotations

import json
from typing import Any

# /generate: the top-level fields and sampling fields (SGLang's names) the router keeps.
_GENERATE_FIELDS = frozenset(
    {
        "text",
        "input_ids",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "return_text_in_logprobs",
        "stream",
        "rid",
    }
)
_SAMPLING_FIELDS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "no_stop_trim",
        "n",
        "sampling_seed",
        "regex",
        "json_schema",
        "ebnf",
    }
)
# braid's names -> SGLang's (braid's server takes both).
_SGLANG_NAMES = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "grammar": "ebnf",
    "seed": "sampling_seed",
}
# Chat completions: braid's extra fields the router drops.
_CHAT_DROPPED = frozenset({"stop_regex", "choices", "grammar", "json_schema", "close_documents"})


def for_router(path: str, body: dict[str, Any], model: str) -> dict[str, Any] | None:
    """`body` as the router will forward it intact, or None when it cannot. `model`: the
    served model's name, which the router requires on OpenAI requests (braid does not).
    A request with a cache salt goes to a replica by the front's affinity, which keys on
    the salt: the router drops the salt from chat completions (its cache then shared with
    every other client's), and routes by the text alone elsewhere (a salted request sent
    where the prefix is cached for others, where it can reuse none of it)."""
    if body.get("cache_salt") is not None:
        return None
    if path == "/generate":
        return _generate(body)
    if path == "/v1/completions":
        prompt = body.get("prompt")
        texts = prompt if isinstance(prompt, list) else [prompt]
        if not all(isinstance(t, str) for t in texts):
            return None
        return _with_model(_schema_as_text(body), model)
    if path == "/v1/chat/completions":
        if any(body.get(k) is not None for k in _CHAT_DROPPED):
            return None
        return _with_model(body, model)
    return body


def routing_text(path: str, body: dict[str, Any]) -> str:
    """The text a request's prefix affinity is computed on: its prompt, or its messages,
    after its cache salt (requests share cached prefixes only under one salt)."""
    salt = body.get("cache_salt")
    return ("" if salt is None else json.dumps(salt)) + _prompt_text(path, body)


def _prompt_text(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/chat/completions":
        return json.dumps(body.get("messages"))
    for key in ("text", "prompt", "prefix", "input_ids"):
        if body.get(key) is not None:
            value = body[key]
            return value if isinstance(value, str) else json.dumps(value)
    return ""


def _generate(body: dict[str, Any]) -> dict[str, Any] | None:
    given = {k: v for k, v in body.items() if v is not None}
    if not given.keys() <= _GENERATE_FIELDS:
        return None
    ids = given.get("input_ids")
    if not isinstance(given.get("text", ""), str) or any(isinstance(t, list) for t in ids or []):
        return None  # a batch: the router takes one prompt per request
    sampling = given.get("sampling_params", {})
    if not isinstance(sampling, dict):
        return None
    renamed: dict[str, Any] = {}
    for key, value in sampling.items():
        if value is None:
            continue
        key = _SGLANG_NAMES.get(key, key)
        if key in renamed:  # both names given: braid's server says which
            return None
        renamed[key] = value
    if not renamed.keys() <= _SAMPLING_FIELDS:
        return None
    return {**given, "sampling_params": _schema_as_text(renamed)}


def _with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    return body if body.get("model") is not None else {**body, "model": model}


def _schema_as_text(fields: dict[str, Any]) -> dict[str, Any]:
    """The router takes a JSON schema only as JSON text (braid takes both)."""
    schema = fields.get("json_schema")
    if isinstance(schema, dict):
        return {**fields, "json_schema": json.dumps(schema)}
    return fields
