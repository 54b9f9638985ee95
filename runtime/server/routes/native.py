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

from braid.runtime.protocol.outputs import GenerateOutput, StreamChunk
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.http.disconnects import unless_disconnected
from braid.runtime.server.http.limits import check_continuations, check_fields, check_max_tokens
from braid.runtime.server.http.sse import event_stream
from braid.runtime.server.metrics import CONTENT_TYPE
from braid.runtime.server.request_context import context_of
from braid.runtime.server.service import Service, samples
from braid.runtime.server.wire import (
    BadRequest,
    GenerateRequest,
    LoraAdapterRequest,
    PrepareRequest,
    ReleaseRequest,
    ScoreRequest,
    convert,
    decode_object,
)


async def generate(request: Request) -> Response:
    svc: Service = request.app.state.service
    req = convert(decode_object(await request.body()), GenerateRequest)
    # The engine refuses an adapter name it has not loaded.
    ctx = context_of(request, salt=req.cache_salt, lora=req.lora_path, program=req.program_id)
    stream = svc.streamer(ctx)
    prompts, batch = req.prompts()
    given_rids = req.rids(len(prompts))
    fields = _sampling_fields(req)
    for where, item in fields:
        check_fields(item, svc.limits, where)
    svc.check_room(len(prompts))
    prepared: list[tuple[list[int], SamplingParams]] = []
    for i, prompt in enumerate(prompts):
        ids = await svc.encode(prompt)
        params = req.params(i, len(ids))
        if params.token_healing:
            # A listing of the prompt is of the one prefilled: healed first, counted after.
            unlisted = msgspec.structs.replace(params, prompt_logprobs_from=None)
            ids = await svc.off_loop(svc.engine.heal, prompt, ids, unlisted)
            params = req.params(i, len(ids))
        where, item = fields[i if len(fields) > 1 else 0]  # one for all, or one each
        for name in ("max_new_tokens", "max_tokens"):  # SGLang's check: given, it must fit
            if item.get(name) is not None:
                context = svc.engine.context_length
                check_max_tokens(where + name, params.max_tokens, len(ids), context)
        prepared.append((ids, params))
    svc.check_room(sum(params.n for _, params in prepared))  # before the samples expand
    jobs: list[tuple[list[int], SamplingParams]] = []
    rids: list[str] = []
    for (ids, params), rid in zip(prepared, given_rids, strict=True):
        await svc.check_params(params, request)
        jobs += [(ids, p) for p in samples(params)]
        rids += [rid] if params.n == 1 else [f"{rid}-{j}" for j in range(params.n)]
    start = time.monotonic()

    def result(i: int, text: str, out_ids: list[int], chunk: StreamChunk | GenerateOutput):
        """One job's result so far: all its text and ids, and, when it asked for them, the
        logprobs of the tokens this result adds (a stream's event: the chunk's; at the end
        of a plain request: all of them) with the count of output logprobs so far."""
        info = {"id": rids[i], "prompt_tokens": len(jobs[i][0]), "completion_tokens": len(out_ids)}
        finish, meta = chunk.finish_reason, chunk.meta or {}
        info["finish_reason"] = None if finish is None else _finish_reason(finish, meta)
        if finish is not None:
            info.update(
                cached_tokens=meta["cached_tokens"],
                preemptions=meta["preemptions"],
                e2e_latency=time.monotonic() - start,
            )
            if "reasoning_tokens" in meta:
                info["reasoning_tokens"] = meta["reasoning_tokens"]
        if req.return_logprob:
            lister = _Logprobs(svc, req.return_text_in_logprobs, req.top_logprobs_num > 0)
            if isinstance(chunk, StreamChunk):
                new = (chunk.token_ids, chunk.logprobs or [], chunk.top_logprobs or [])
            else:
                new = (out_ids, meta.get("logprobs", []), meta.get("top_logprobs", []))
            if "next_top_logprobs" in meta:  # max_new_tokens=0: the top tokens after the prompt
                new = (new[0], new[1], [meta["next_top_logprobs"]])
            info.update(lister.output(*new), output_token_logprobs_length=len(out_ids))
            if finish is not None:
                first = req.prompt_logprobs_start(len(jobs[i][0]))
                info.update(lister.input(jobs[i][0][first:], first == 0, meta))
        return {"text": text, "output_ids": out_ids, "meta_info": info, "index": i}

    if req.stream:
        texts: list[list[str]] = [[] for _ in jobs]
        ids: list[list[int]] = [[] for _ in jobs]

        def render(i: int, chunk: StreamChunk) -> Iterable[dict]:
            # SGLang streams the whole text and ids so far in every event, and the logprobs
            # of the event's new tokens only.
            texts[i].append(chunk.text)
            ids[i] += chunk.token_ids
            yield result(i, "".join(texts[i]), list(ids[i]), chunk)

        return event_stream(svc, jobs, stream, render, listings=req.return_logprob)

    outs = await unless_disconnected(request, svc.collect_all(jobs, stream))

    def reply() -> Response:
        results = [result(i, o.text, o.token_ids, o) for i, o in enumerate(outs)]
        return JSONResponse(results if batch or len(results) > 1 else results[0])

    return await svc.build_reply(reply, req.return_logprob)


def _sampling_fields(req: GenerateRequest) -> list[tuple[str, dict]]:
    """(the field names' prefix, the raw fields) of each sampling_params given: one for all
    prompts, or one per prompt."""
    raw = req.sampling_params
    if isinstance(raw, list):
        return [(f"sampling_params[{i}].", item) for i, item in enumerate(raw)]
    return [("sampling_params.", raw or {})]


def _finish_reason(reason: str, meta: dict) -> dict:
    if reason == "length":
        return {"type": "length", "length": meta["completion_tokens"]}
    return {"type": reason, "matched": None}


class _Logprobs:
    """SGLang's listings: [logprob, token id, text or None] per token, and per position a
    list of such entries for the top alternatives."""

    def __init__(self, svc: Service, show_text: bool, with_top: bool) -> None:
        self.svc, self.show_text, self.with_top = svc, show_text, with_top

    def output(self, ids: list[int], lps: list[float], tops: list[dict]) -> dict:
        out = {"output_token_logprobs": self._entries(lps, ids)}
        if self.with_top:
            out["output_top_logprobs"] = [self._top(top) for top in tops]
        return out

    def input(self, ids: list[int], from_first: bool, meta: dict) -> dict:
        """The prompt's listing from its first reported token; the prompt's first token has
        no logprob (nor alternatives)."""
        lps = meta.get("prompt_logprobs", [])
        out = {"input_token_logprobs": self._entries([None] * from_first + lps, ids)}
        if self.with_top:
            tops = [self._top(top) for top in meta.get("prompt_top_logprobs", [])]
            out["input_top_logprobs"] = [None] * from_first + tops
        return out

    def _entries(self, lps: list, ids: list[int]) -> list[list]:
        texts = self.svc.token_texts(ids) if self.show_text else [None] * len(ids)
        return [[lp, t, s] for lp, t, s in zip(lps, ids, texts, strict=True)]

    def _top(self, top: dict[int, float]) -> list[list]:
        return self._entries(list(top.values()), list(top))


async def get_model_info(request: Request) -> Response:
    svc: Service = request.app.state.service
    template, openings = svc.chat_template, svc.generation_openings
    fmt = svc.engine.reasoning_format
    return JSONResponse(
        {
            "model_path": svc.model_path,
            "tokenizer_path": svc.model_path,
            "served_model_name": svc.model_name,
            "is_generation": True,
            "context_length": svc.engine.context_length,
            # braid's RemoteBackend renders roles with these (see runtime.chat_template),
            # opens a gen's assistant message as the generation prompt does, and splits a
            # reasoning gen's thought off in the model's format.
            "chat_template": None if template is None else dataclasses.asdict(template),
            "generation_openings": None if openings is None else openings.to_wire(),
            "reasoning_format": None if fmt is None else dataclasses.asdict(fmt),
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


async def load_lora_adapter(request: Request) -> Response:
    """Load a PEFT LoRA adapter directory (a path on the server) under a name."""
    svc: Service = request.app.state.service
    req = convert(decode_object(await request.body()), LoraAdapterRequest)
    if req.lora_path is None:
        raise BadRequest("lora_path: the adapter's directory is required")
    await asyncio.to_thread(svc.engine.load_lora, req.lora_name, req.lora_path)
    return JSONResponse({"success": True, "loaded_adapters": _adapters(svc)})


async def unload_lora_adapter(request: Request) -> Response:
    """Forget an adapter (a 400 while a request uses it)."""
    svc: Service = request.app.state.service
    req = convert(decode_object(await request.body()), LoraAdapterRequest)
    await asyncio.to_thread(svc.engine.unload_lora, req.lora_name)
    return JSONResponse({"success": True, "loaded_adapters": _adapters(svc)})


def _adapters(svc: Service) -> list[str]:
    return sorted(svc.engine.adapters)


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def health_generate(request: Request) -> Response:
    """Healthy when the engine generates a token (under the caller's tenant, as any request
    of its API key)."""
    svc: Service = request.app.state.service
    ctx = context_of(request)
    params = SamplingParams(max_tokens=1, temperature=0)
    ids = await svc.encode("ok")
    await unless_disconnected(request, svc.collect_all([(ids, params)], svc.streamer(ctx)))
    return Response(status_code=200)


async def metrics(request: Request) -> Response:
    svc: Service = request.app.state.service
    body = await asyncio.to_thread(svc.metrics.render)
    return Response(body, media_type=CONTENT_TYPE)


async def score(request: Request) -> Response:
    """The logprobs `select` ranks choices by, aligned exactly as a local engine aligns them.
    Each continuation is tokenized with the prefix: the text is checked before any of it is,
    and tokenized off the event loop; each is a sequence held in the queue limit."""
    svc: Service = request.app.state.service
    req = convert(decode_object(await request.body()), ScoreRequest)
    ctx = context_of(request, salt=req.cache_salt, lora=req.lora_path)
    prefix, continuations = req.prefix, req.continuations
    check_continuations(prefix, continuations, svc.limits)
    # With the prefix, each continuation is a prompt, bounded as any prompt is.
    longest = max((len(c) for c in continuations), default=0)
    svc.check_text_length(len(prefix) + longest, "prefix + continuation")

    async def run() -> list[list[float]]:
        # Held until the engine has ended every leaf, those of a client that left included.
        with svc.admit(len(continuations)):
            leaves = await svc.off_loop(svc.engine.score_leaves, prefix, continuations)
            svc.check_prompt_tokens(max(len(ids) for ids, _ in leaves))
            return await svc.engine.ascore_leaves(leaves, ctx.cache_salt, ctx.lora)

    logprobs = await unless_disconnected(request, run())  # a ValueError is a 400
    return JSONResponse({"logprobs": logprobs})


async def release(request: Request) -> Response:
    """A program state will not continue: its leased prefix becomes an ordinary cache
    entry (a lease of another salt or tenant is another key, untouched)."""
    svc: Service = request.app.state.service
    req = convert(decode_object(await request.body()), ReleaseRequest)
    ctx = context_of(request, salt=req.cache_salt, lora=req.lora_path, program=req.program_id)
    try:
        svc.engine.release_program(ctx.program, ctx.cache_salt, ctx.lora)
    except ValueError as e:  # an adapter it has not loaded
        raise BadRequest(str(e)) from None
    return JSONResponse({"released": req.program_id})


async def prepare(request: Request) -> Response:
    """Compile a constraint ahead of its request (the compile cache keeps it for /generate);
    answers once it is compiled, with a 400 for a bad one."""
    svc: Service = request.app.state.service
    req = convert(decode_object(await request.body()), PrepareRequest)
    check_fields(req.sampling_params, svc.limits, "sampling_params.")
    params = GenerateRequest(text="", sampling_params=req.sampling_params).params(0, 0)
    await svc.check_params(params, request)
    return JSONResponse({"prepared": True})


ROUTES = [
    Route("/generate", generate, methods=["POST"]),
    Route("/get_model_info", get_model_info, methods=["GET"]),
    # SGLang's newer name, which its router asks for first.
    Route("/model_info", get_model_info, methods=["GET"]),
    Route("/server_info", server_info, methods=["GET"]),
    Route("/get_server_info", server_info, methods=["GET"]),
    Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/health_generate", health_generate, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/braid/score", score, methods=["POST"]),
    Route("/braid/release", release, methods=["POST"]),
    Route("/braid/prepare", prepare, methods=["POST"]),
]
# They load files from the server's disk: only with create_app(lora_updates=True).
LORA_ROUTES = [
    Route("/load_lora_adapter", load_lora_adapter, methods=["POST"]),
    Route("/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
]
