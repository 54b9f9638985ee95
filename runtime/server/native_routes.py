"""SGLang-compatible native routes (/generate and friends, as SGLang's RuntimeEndpoint calls
them), /health, /metrics, and braid's own /braid/score for remote `select`."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from braid.runtime.outputs import StreamChunk
from braid.runtime.sampling_params import SamplingParams
from braid.runtime.server.metrics import CONTENT_TYPE
from braid.runtime.server.service import Service, samples, unless_disconnected
from braid.runtime.server.sse import event_stream
from braid.runtime.server.wire import GenerateRequest, ScoreRequest, convert, decode_object


async def generate(request: Request) -> Response:
    svc: Service = request.app.state.service
    req = convert(decode_object(await request.body()), GenerateRequest)
    prompts, batch = req.prompts()
    given_rids = req.rids(len(prompts))
    svc.check_room(len(prompts))
    prepared: list[tuple[list[int], SamplingParams]] = []
    for i, prompt in enumerate(prompts):
        ids = await svc.encode(prompt)
        prepared.append((ids, req.params(i, len(ids))))
    svc.check_room(sum(params.n for _, params in prepared))  # before the samples expand
    jobs: list[tuple[list[int], SamplingParams]] = []
    rids: list[str] = []
    for (ids, params), rid in zip(prepared, given_rids, strict=True):
        await svc.check_params(params)
        jobs += [(ids, p) for p in samples(params)]
        rids += [rid] if params.n == 1 else [f"{rid}-{j}" for j in range(params.n)]
    start = time.monotonic()

    def result(i: int, text: str, out_ids: list[int], finish: str | None, meta: dict) -> dict:
        info = {"id": rids[i], "prompt_tokens": len(jobs[i][0]), "finish_reason": None}
        if finish is not None:
            info.update(
                completion_tokens=meta["completion_tokens"],
                cached_tokens=meta["cached_tokens"],
                preemptions=meta["preemptions"],
                finish_reason=_finish_reason(finish, meta),
                e2e_latency=time.monotonic() - start,
            )
            if req.return_logprob:
                info.update(_logprobs(svc, req, jobs[i][0], out_ids, meta))
        else:
            info["completion_tokens"] = len(out_ids)
        return {"text": text, "output_ids": out_ids, "meta_info": info, "index": i}

    if req.stream:
        texts: list[list[str]] = [[] for _ in jobs]
        ids: list[list[int]] = [[] for _ in jobs]

        def render(i: int, chunk: StreamChunk) -> Iterable[dict]:
            # SGLang streams the whole text so far in every event.
            texts[i].append(chunk.text)
            ids[i] += chunk.token_ids
            text = "".join(texts[i])
            yield result(i, text, list(ids[i]), chunk.finish_reason, chunk.meta or {})

        return event_stream(svc, jobs, render)

    outs = await unless_disconnected(request, svc.collect_all(jobs))
    results = [result(i, o.text, o.token_ids, o.finish_reason, o.meta) for i, o in enumerate(outs)]
    return JSONResponse(results if batch or len(results) > 1 else results[0])


def _finish_reason(reason: str, meta: dict) -> dict:
    if reason == "length":
        return {"type": "length", "length": meta["completion_tokens"]}
    return {"type": reason, "matched": None}


def _logprobs(
    svc: Service, req: GenerateRequest, prompt_ids: list[int], out_ids: list[int], meta: dict
) -> dict:
    """SGLang's listings: [logprob, token id, text or None] per token, and per position a
    list of such entries for the top alternatives. Prompt positions have no alternatives."""
    show = req.return_text_in_logprobs

    def entries(lps: list, ids: list[int]) -> list[list]:
        texts = svc.token_texts(ids) if show else [None] * len(ids)
        return [[lp, t, s] for lp, t, s in zip(lps, ids, texts, strict=True)]

    start = req.prompt_logprobs_start(len(prompt_ids))
    prompt_lps = ([None] if start == 0 else []) + meta.get("prompt_logprobs", [])
    out = {
        "input_token_logprobs": entries(prompt_lps, prompt_ids[start:]),
        "output_token_logprobs": entries(meta.get("logprobs", []), out_ids),
    }
    if req.top_logprobs_num > 0:
        out["input_top_logprobs"] = [None] * len(out["input_token_logprobs"])
        out["output_top_logprobs"] = [
            entries(list(top.values()), list(top)) for top in meta.get("top_logprobs", [])
        ]
    return out


async def get_model_info(request: Request) -> Response:
    svc: Service = request.app.state.service
    template = svc.chat_template
    return JSONResponse(
        {
            "model_path": svc.model_path,
            "tokenizer_path": svc.model_path,
            "served_model_name": svc.model_name,
            "is_generation": True,
            "context_length": svc.engine.context_length,
            # braid's RemoteBackend renders roles with these (see runtime.chat_template).
            "chat_template": None if template is None else dataclasses.asdict(template),
        }
    )


async def server_info(request: Request) -> Response:
    svc: Service = request.app.state.service
    config = msgspec.to_builtins(dataclasses.asdict(svc.engine.config))
    stats = await asyncio.to_thread(svc.engine.stats)
    return JSONResponse(
        {
            **config,
            "served_model_name": svc.model_name,
            "context_length": svc.engine.context_length,
            "queue_capacity": svc.capacity,
            "active_sequences": svc.num_active,
            "stats": stats,
        }
    )


async def flush_cache(request: Request) -> Response:
    svc: Service = request.app.state.service
    await asyncio.to_thread(svc.engine.flush_cache)
    return PlainTextResponse("Cache flushed.\n")


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def health_generate(request: Request) -> Response:
    """Healthy when the engine generates a token."""
    svc: Service = request.app.state.service
    params = SamplingParams(max_tokens=1, temperature=0)
    ids = await svc.encode("ok")
    await unless_disconnected(request, svc.collect_all([(ids, params)]))
    return Response(status_code=200)


async def metrics(request: Request) -> Response:
    svc: Service = request.app.state.service
    body = await asyncio.to_thread(svc.metrics.render)
    return Response(body, media_type=CONTENT_TYPE)


async def score(request: Request) -> Response:
    """The logprobs `select` ranks choices by, aligned exactly as a local engine aligns them."""
    svc: Service = request.app.state.service
    req = convert(decode_object(await request.body()), ScoreRequest)

    async def run() -> list[list[float]]:
        with svc.admit(len(req.continuations)):
            return await svc.engine.ascore(req.prefix, req.continuations)

    logprobs = await unless_disconnected(request, run())  # a ValueError is a 400
    return JSONResponse({"logprobs": logprobs})


ROUTES = [
    Route("/generate", generate, methods=["POST"]),
    Route("/get_model_info", get_model_info, methods=["GET"]),
    Route("/server_info", server_info, methods=["GET"]),
    Route("/get_server_info", server_info, methods=["GET"]),
    Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/health_generate", health_generate, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/braid/score", score, methods=["POST"]),
]
