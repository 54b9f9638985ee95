"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from braid.runtime.outputs import StreamChunk
from braid.runtime.server.service import Service, samples, unless_disconnected
from braid.runtime.server.sse import event_stream
from braid.runtime.server.wire import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    decode_object,
    openai_request,
)


async def models(request: Request) -> Response:
    svc: Service = request.app.state.service
    card = {
        "id": svc.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "braid",
        "max_model_len": svc.engine.context_length,
    }
    return JSONResponse({"object": "list", "data": [card]})


async def completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    req, params = openai_request(obj, CompletionRequest, svc.engine.context_length)
    prompts = _prompts(req.prompt)
    svc.check_room(len(prompts) * params.n)  # before anything is tokenized or expanded
    prompt_ids = [await svc.encode(p) for p in prompts]
    await svc.check_params(params)
    jobs = [(ids, p) for ids in prompt_ids for p in samples(params)]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": svc.model_name}
    prefix = [svc.engine.tokenizer.decode(ids) if req.echo else "" for ids in prompt_ids]

    def logprobs(i: int, ids: list[int], meta: dict) -> dict | None:
        if req.logprobs is None:
            return None
        tokens, lps, tops = [], [], []
        if req.echo:
            tokens += jobs[i][0]
            lps += [None, *meta.get("prompt_logprobs", [])]
            tops += [None] * len(jobs[i][0])
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
        "usage": _usage([o.meta for o in outs], params.n),
    }
    return JSONResponse(body)


async def chat_completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    req, params = openai_request(obj, ChatCompletionRequest, svc.engine.context_length)
    svc.check_room(params.n)
    ids = await svc.encode(await svc.render_chat([m.as_dict() for m in req.messages]))
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
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": out.text},
            "logprobs": logprobs(out.token_ids, out.meta),
            "finish_reason": out.finish_reason,
        }
        for i, out in enumerate(outs)
    ]
    body = {
        **head,
        "object": "chat.completion",
        "choices": choices,
        "usage": _usage([o.meta for o in outs], params.n),
    }
    return JSONResponse(body)


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
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
