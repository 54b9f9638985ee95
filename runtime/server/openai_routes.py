"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from braid.runtime.outputs import StreamChunk
from braid.runtime.sampling_params import SamplingParams
from braid.runtime.server import tools
from braid.runtime.server.limits import check_max_tokens, check_openai_body
from braid.runtime.server.service import Service, samples, unless_disconnected
from braid.runtime.server.sse import event_stream
from braid.runtime.server.wire import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    ModelNotFound,
    decode_object,
    openai_request,
)


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(request)]})


async def model(request: Request) -> Response:
    """GET /v1/models/{id}: the served model's card, or OpenAI's 404 for another id."""
    _check_model(request, request.path_params["model_id"])
    return JSONResponse(_model_card(request))


def _model_card(request: Request) -> dict:
    svc: Service = request.app.state.service
    return {
        "id": svc.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "braid",
        "max_model_len": svc.engine.context_length,
    }


def _check_model(request: Request, name: object) -> None:
    """A model name other than the served one is a 404 (as OpenAI answers), unless the server
    accepts any name (`braid serve --accept-any-model`)."""
    svc: Service = request.app.state.service
    if (
        isinstance(name, str)
        and name != svc.model_name
        and not getattr(request.app.state, "accept_any_model", False)
    ):
        raise ModelNotFound(name)


def _openai_request(request: Request, obj: dict, kind: type):
    """The request's Struct and SamplingParams, its model checked first, then its fields
    against the server's limits."""
    _check_model(request, obj.get("model"))
    svc: Service = request.app.state.service
    check_openai_body(obj, svc.limits)
    return openai_request(obj, kind, svc.engine.context_length)


def _check_context(svc: Service, obj: dict, params: SamplingParams, prompt_ids: list) -> None:
    """A max_tokens (or max_completion_tokens) the request gives must fit the model's context
    with each prompt, as OpenAI requires; absent, it is the rest of the context."""
    for field in ("max_completion_tokens", "max_tokens"):
        if obj.get(field) is not None:
            for ids in prompt_ids:
                check_max_tokens(field, params.max_tokens, len(ids), svc.engine.context_length)
            return


async def completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    req, params = _openai_request(request, obj, CompletionRequest)
    prompts = _prompts(req.prompt)
    drawn = _best_of(req, params)  # best_of samples per prompt, of which n are returned
    svc.check_room(len(prompts) * drawn.n)  # before anything is tokenized or expanded
    prompt_ids = [await svc.encode(p) for p in prompts]
    _check_context(svc, obj, params, prompt_ids)
    await svc.check_params(params)
    jobs = [(ids, p) for ids in prompt_ids for p in samples(drawn)]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": svc.model_name}
    prefix = [svc.engine.tokenizer.decode(ids) if req.echo else "" for ids in prompt_ids]

    def logprobs(i: int, ids: list[int], meta: dict) -> dict | None:
        if req.logprobs is None:
            return None
        tokens, lps, tops = [], [], []
        if req.echo:  # the prompt's tokens first; the first has no logprob
            prompt_lps = meta.get("prompt_logprobs", [])
            prompt_tops = meta.get("prompt_top_logprobs") or [{} for _ in prompt_lps]
            tokens += jobs[i][0]
            lps += [None, *prompt_lps]
            tops += [None, *(_top_by_text(svc, top) for top in prompt_tops)]
        tokens += ids
        lps += meta.get("logprobs", [])
        tops += [_top_by_text(svc, top) for top in meta.get("top_logprobs", [])]
        texts = svc.token_texts(tokens)
        offsets = [0, *itertools.accumulate(len(t) for t in texts)][:-1]
        return {
            "tokens": texts,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    if req.stream:
        out_ids: list[list[int]] = [[] for _ in jobs]

        def render(i: int, chunk: StreamChunk) -> Iterable[dict]:
            text = chunk.text
            if req.echo and not out_ids[i]:  # the first chunk (every chunk is sent)
                text = prefix[i // params.n] + text
            out_ids[i] += chunk.token_ids
            lp = None
            if chunk.finish_reason is not None:  # the engine reports logprobs at the end
                lp = logprobs(i, out_ids[i], chunk.meta or {})
            choice = {
                "index": i,
                "text": text,
                "logprobs": lp,
                "finish_reason": chunk.finish_reason,
            }
            yield {**head, "object": "text_completion", "choices": [choice]}

        return event_stream(svc, jobs, render, _usage_chunk(req, head, "text_completion", params.n))

    outs = await unless_disconnected(request, svc.collect_all(jobs))
    metas = [o.meta for o in outs]  # every sample counts in the usage
    jobs, outs = _best(jobs, outs, drawn.n, params.n)
    choices = [
        {
            "index": i,
            "text": prefix[i // params.n] + out.text,
            "logprobs": logprobs(i, out.token_ids, out.meta),
            "finish_reason": out.finish_reason,
        }
        for i, out in enumerate(outs)
    ]
    body = {
        **head,
        "object": "text_completion",
        "choices": choices,
        "usage": _usage(metas, drawn.n),
    }
    return JSONResponse(body)


async def chat_completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    req, params = _openai_request(request, obj, ChatCompletionRequest)
    svc.check_room(params.n)
    plan = tools.plan(req)
    svc.check_text_length(sum(len(m.text) for m in req.messages), "messages")
    if tools.uses_tools(req):
        ids = await svc.encode(await _render_with_tools(request, req))
    else:
        ids = await svc.encode(await svc.render_chat([m.as_dict() for m in req.messages]))
    _check_context(svc, obj, params, [ids])
    calling = plan is not None and plan.calls  # the output may be calls: constrained, parsed
    if calling:
        params = await tools.constrain(svc, plan, params)
    await svc.check_params(params)
    jobs = [(ids, p) for p in samples(params)]
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": svc.model_name,
    }

    def logprobs(ids: list[int], meta: dict) -> dict | None:
        if not params.wants_logprobs:
            return None
        content = []
        for text, lp, top in zip(
            svc.token_texts(ids),
            meta.get("logprobs", []),
            meta.get("top_logprobs", []),
            strict=True,
        ):
            alternatives = [
                {"token": t, "logprob": v, "bytes": list(t.encode())}
                for t, v in _top_by_text(svc, top).items()
            ]
            entry = {"token": text, "logprob": lp, "bytes": list(text.encode())}
            content.append({**entry, "top_logprobs": alternatives})
        return {"content": content}

    if req.stream and calling:
        out_ids: list[list[int]] = [[] for _ in jobs]
        parsers = [tools.CallParser() for _ in jobs]
        started = [False for _ in jobs]

        def render_calls(i: int, chunk: StreamChunk) -> Iterable[dict]:
            events = parsers[i].feed(chunk.text)
            out_ids[i] += chunk.token_ids
            lp, finish = None, None
            if chunk.finish_reason is not None:
                events += parsers[i].finish()
                lp = logprobs(out_ids[i], chunk.meta or {})
                finish = tools.finish_reason(parsers[i], chunk.finish_reason)
            delta = tools.delta(parsers[i], events)
            if not started[i]:  # the first chunk carries the role, whatever else it has
                started[i] = True
                delta = {"role": "assistant", **delta}
            elif not delta and finish is None:
                return
            choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}
            yield {**head, "object": "chat.completion.chunk", "choices": [choice]}

        return event_stream(
            svc, jobs, render_calls, _usage_chunk(req, head, "chat.completion.chunk", params.n)
        )

    if req.stream:
        out_ids: list[list[int]] = [[] for _ in jobs]

        def render(i: int, chunk: StreamChunk) -> Iterable[dict]:
            delta = {"content": chunk.text}
            if not out_ids[i]:
                delta["role"] = "assistant"
            out_ids[i] += chunk.token_ids
            lp = None
            if chunk.finish_reason is not None:  # the engine reports logprobs at the end
                lp = logprobs(out_ids[i], chunk.meta or {})
            # A chunk whose text is held back (a partial stop string, a split character)
            # is still sent when it is the first: it carries the role.
            if chunk.text or chunk.finish_reason is not None or "role" in delta:
                choice = {
                    "index": i,
                    "delta": delta,
                    "logprobs": lp,
                    "finish_reason": chunk.finish_reason,
                }
                yield {**head, "object": "chat.completion.chunk", "choices": [choice]}

        return event_stream(
            svc, jobs, render, _usage_chunk(req, head, "chat.completion.chunk", params.n)
        )

    outs = await unless_disconnected(request, svc.collect_all(jobs))
    choices = []
    for i, out in enumerate(outs):
        message, finish = {"role": "assistant", "content": out.text}, out.finish_reason
        if calling:
            message, finish = tools.message(out.text, out.finish_reason)
        logprob_listing = logprobs(out.token_ids, out.meta)
        choices.append(
            {"index": i, "message": message, "logprobs": logprob_listing, "finish_reason": finish}
        )
    body = {
        **head,
        "object": "chat.completion",
        "choices": choices,
        "usage": _usage([o.meta for o in outs], params.n),
    }
    return JSONResponse(body)


async def _render_with_tools(request: Request, req: ChatCompletionRequest) -> list[int]:
    """The prompt's tokens of a conversation with tools, calls or tool results: through the
    model's chat template, which renders them itself where it can (tools.conversation)."""
    svc: Service = request.app.state.service
    native = request.app.state.tools_in_template
    system_role = svc.chat_template is not None and "system" in svc.chat_template.closing
    messages, tool_list = tools.conversation(req, native, system_role)

    def render() -> list[int]:
        return svc.engine.tokenizer.apply_chat_template(
            messages, tools=tool_list, add_generation_prompt=True, tokenize=True, return_dict=False
        )

    try:
        return await svc.off_loop(render)
    except Exception as e:  # the template refused the conversation
        raise BadRequest(f"the model's chat template cannot render these messages: {e}") from None


def _best_of(req: CompletionRequest, params: SamplingParams) -> SamplingParams:
    """What a completion samples: best_of samples per prompt (with their logprobs, to rank
    them) when it asks for more than n, else params."""
    if req.best_of is None or req.best_of == params.n:
        return params
    if req.best_of < params.n:
        raise BadRequest(f"best_of ({req.best_of}) must be >= n ({params.n})")
    if req.stream:
        raise BadRequest("best_of cannot be streamed (unless it equals n)")
    return msgspec.structs.replace(params, n=req.best_of, logprobs=True)


def _best(jobs: list, outs: list, drawn: int, n: int) -> tuple[list, list]:
    """Of each prompt's `drawn` samples, the n with the highest logprob per token (OpenAI's
    best_of), best first."""
    if drawn == n:
        return jobs, outs

    def score(i: int) -> float:
        lps = outs[i].meta.get("logprobs") or []
        return sum(lps) / len(lps) if lps else float("-inf")

    kept = []
    for start in range(0, len(outs), drawn):
        group = sorted(range(start, start + drawn), key=score, reverse=True)
        kept += group[:n]
    return [jobs[i] for i in kept], [outs[i] for i in kept]


def _prompts(prompt: str | list) -> list[str | list[int]]:
    """A completion's prompt: text, token ids, or a list of either."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise BadRequest("prompt must not be empty")
    if all(isinstance(p, int) for p in prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt) or all(
        isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt
    ):
        return list(prompt)
    raise BadRequest("prompt must be a string, a list of token ids, or a list of either")


def _top_by_text(svc: Service, top: dict[int, float]) -> dict[str, float]:
    return dict(zip(svc.token_texts(list(top)), top.values(), strict=True))


def _usage(metas: list[dict], n: int) -> dict:
    """Token counts of all samples; a prompt's tokens count once (its n samples share it)."""
    firsts = metas[::n]
    prompt = sum(m["prompt_tokens"] for m in firsts)
    completion = sum(m["completion_tokens"] for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(m["cached_tokens"] for m in firsts)},
    }


def _usage_chunk(req, head: dict, kind: str, n: int) -> Callable[[list[dict]], dict] | None:
    """With stream_options.include_usage, the last event: no choices, the usage."""
    if req.stream_options is None or not req.stream_options.include_usage:
        return None
    return lambda metas: {**head, "object": kind, "choices": [], "usage": _usage(metas, n)}


ROUTES = [
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", model, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
