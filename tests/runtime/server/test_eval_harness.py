"""Eval harnesses against the server: lm-evaluation-harness's exact request shapes (its
local-completions model over /v1/completions, its sglang-generate model over /generate),
parsed as it parses them, checked against transformers; and /generate's streamed logprobs."""

from __future__ import annotations

import json

import httpx
import pytest

# What lm-eval's local-completions model sends: loglikelihood as an echoed one-token
# completion of the tokenized context + continuation, generate_until with `until` as stop.
SEED = 1234


def loglikelihood_payload(token_lists: list[list[int]]) -> dict:
    return {
        "model": "tiny",
        "prompt": token_lists,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": SEED,
        "echo": True,
    }


def lm_eval_parse_logprobs(out: dict, ctxlens: list[int]) -> list[tuple[float, bool]]:
    """lm-eval's reading of the response: the continuation's summed logprob, and whether
    each of its tokens was the most likely one."""
    res = []
    for choice, ctxlen in zip(
        sorted(out["choices"], key=lambda c: c["index"]), ctxlens, strict=True
    ):
        token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(
            tok == max(top.values()) for tok, top in zip(token_logprobs, top_logprobs, strict=True)
        )
        res.append((sum(token_logprobs), greedy))
    return res


def reference_greedy(tiny_model_path, ids: list[int], ctxlen: int) -> bool:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return all(int(logits[i - 1].argmax()) == ids[i] for i in range(ctxlen, len(ids)))


def test_loglikelihood_requests_parse_as_lm_eval_parses_them(
    engine, server, reference_logprobs, tiny_model_path
):
    context = engine.encode("Question: what colour is the sky?\nAnswer:")
    continuations = [
        engine.tokenizer.encode(c, add_special_tokens=False) for c in (" blue", " green grass")
    ]
    requests = [context + c for c in continuations]
    # A continuation of the model's own greedy tokens: lm-eval must see it as greedy.
    greedy = engine.generate(context, _greedy(3)).token_ids
    requests.append(context + greedy)
    r = httpx.post(server.url + "/v1/completions", json=loglikelihood_payload(requests))
    assert r.status_code == 200, r.text
    parsed = lm_eval_parse_logprobs(r.json(), [len(context)] * len(requests))
    for (total, is_greedy), ids in zip(parsed, requests, strict=True):
        assert total == pytest.approx(sum(reference_logprobs(ids, len(context))), abs=1e-3)
        assert is_greedy == reference_greedy(tiny_model_path, ids, len(context))
    assert parsed[-1][1] is True
    for choice in r.json()["choices"]:  # one top entry per position after the first
        tops = choice["logprobs"]["top_logprobs"]
        assert tops[0] is None and all(len(t) >= 1 for t in tops[1:])


def test_generate_until_requests(engine, server):
    body = {
        "model": "tiny",
        "prompt": [engine.encode("Once upon"), engine.encode("Hello there")],
        "max_tokens": 16,
        "temperature": 0,
        "stop": ["\n\n", "Question:"],
        "seed": SEED,
    }
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    texts = [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
    params = _greedy(16, stop=["\n\n", "Question:"])
    assert texts == [engine.generate(p, params).text for p in body["prompt"]]


def test_sglang_generate_loglikelihood_shape(engine, server, reference_logprobs):
    """lm-eval's sglang-generate model: input logprobs from the start, one top alternative
    each (it reads input_top_logprobs[ctxlen:][0])."""
    ids = engine.encode("The quick brown fox jumps")
    body = {
        "input_ids": [ids],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "logprob_start_len": 0,
        "top_logprobs_num": 1,
        "return_logprob": True,
    }
    [out] = httpx.post(server.url + "/generate", json=body).json()
    meta = out["meta_info"]
    lps = [x[0] for x in meta["input_token_logprobs"]]
    assert lps[0] is None and lps[1:] == pytest.approx(reference_logprobs(ids, 1), abs=1e-4)
    tops = meta["input_top_logprobs"]
    assert tops[0] is None and all(
        len(t) == 1 and t[0][0] >= lp for t, lp in zip(tops[1:], lps[1:], strict=True)
    )


def test_generate_streams_each_chunks_logprobs(engine, server):
    body = {
        "text": "Once upon",
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    plain = httpx.post(server.url + "/generate", json=body).json()["meta_info"]
    events = []
    with httpx.stream("POST", server.url + "/generate", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                events.append(json.loads(line[5:])["meta_info"])
    streamed = [e for event in events for e in event["output_token_logprobs"]]
    assert streamed == plain["output_token_logprobs"]
    assert [e for event in events for e in event["output_top_logprobs"]] == (
        plain["output_top_logprobs"]
    )
    lengths = [event["output_token_logprobs_length"] for event in events]
    assert lengths == sorted(lengths) and lengths[-1] == 12 == plain["output_token_logprobs_length"]
    assert "input_token_logprobs" in events[-1]


def _greedy(max_tokens: int, **fields):
    from braid.runtime import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, **fields)
