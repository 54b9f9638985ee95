"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.chat import pipeline
from braid.runtime.server.chat.conversation import Conversation, ConversationRequest
from braid.runtime.server.chat.reasoning_fields import chat_thinking
from braid.runtime.server.chat.reply import Reply
from braid.runtime.server.http.disconnects import unless_disconnected
from braid.runtime.server.http.limits import check_max_tokens, check_openai_body
from braid.runtime.server.http.sse import event_stream
from braid.runtime.server.request_context import context_of
from braid.runtime.server.service import Service, samples
from braid.runtime.server.wire import (
    IGNORED_HEADER,
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    decode_object,
    openai_request,
)

log = logging.getLogger("braid.serve")


async def models(request: Request) -> Response:
    """GET /v1/models: a card for each name the model is served as, the primary first,
    then one for each loaded LoRA adapter."""
    svc: Service = request.app.state.service
    names = [*svc.model_names, *svc.engine.adapters]
    return JSONResponse({"object": "list", "data": [_model_card(request, n) for n in names]})


async def model(request: Request) -> Response:
    """GET /v1/models/{id}: the served model's card under that id, or OpenAI's 404 for an id
    it is not served as."""
    name = request.path_params["model_id"]
    request.app.state.service.check_model(name)
    return JSONResponse(_model_card(request, name))


def _model_card(request: Request, name: str) -> dict:
    svc: Service = request.app.state.service
    card = {
        "id": name,
        "object": "model",
        "created": svc.created,
        "owned_by": "braid",
        "max_model_len": svc.engine.context_length,
    }
    adapter = svc.check_model(name)
    if adapter is not None:  # as vLLM lists an adapter: its base model as parent
        card["parent"] = svc.model_name
    return card


def _openai_request(request: Request, obj: dict, kind: type):
    """The request's Struct, its SamplingParams, the fields it sent that braid ignores
    (logged: _ignoring) and the context of its engine requests (the adapter its model names,
    its cache_salt), its model checked first, then its fields against the limits."""
    svc: Service = request.app.state.service
    lora = svc.check_model(obj.get("model"))
    check_openai_body(obj, svc.limits)
    req, params, ignored = openai_request(obj, kind, svc.engine.context_length)
    return req, params, ignored, context_of(request, salt=req.cache_salt, lora=lora)


def _ignoring(response: Response, ignored: list[str], route: str) -> Response:
    """Unknown fields are ignored, as vLLM and SGLang ignore them (clients send their own
    extensions), and said so: in the log and in a response header naming them."""
    if ignored:
        # The names are the client's: escaped as JSON does (no control character reaches the
        # header or the log, and a header is latin-1), one that is empty or blank at its ends
        # quoted (a header value may not end in whitespace), and cut to a bounded length.
        names = ", ".join(_header_name(name) for name in ignored)
        if len(names) > _MAX_IGNORED_CHARS:
            names = names[:_MAX_IGNORED_CHARS] + "..."
        log.warning("%s: ignored the unknown fields %s", route, names)
        response.headers[IGNORED_HEADER] = names
    return response


_MAX_IGNORED_CHARS = 1024


def _header_name(name: str) -> str:
    escaped = json.dumps(name)
    return escaped if not name or name != name.strip() else escaped[1:-1]


def _max_tokens_field(obj: dict) -> str | None:
    """The field that set max_tokens, if the request gave one: with each prompt it must fit
    the model's context, as OpenAI requires; absent, max_tokens is the rest of the context."""
    return next(
        (f for f in ("max_completion_tokens", "max_tokens") if obj.get(f) is not None), None
    )


async def completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    req, params, ignored, ctx = _openai_request(request, obj, CompletionRequest)
    prompts = _prompts(req.prompt)
    drawn = _best_of(req, params)  # best_of samples per prompt, of which n are returned
    svc.check_room(len(prompts) * drawn.n)  # before anything is tokenized or expanded
    prompt_ids = [await svc.encode(p) for p in prompts]
    if params.token_healing:
        pairs = zip(prompts, prompt_ids, strict=True)
        prompt_ids = [await svc.off_loop(svc.engine.heal, p, ids, params) for p, ids in pairs]
    field = _max_tokens_field(obj)
    for ids in prompt_ids if field is not None else ():
        check_max_tokens(field, params.max_tokens, len(ids), svc.engine.context_length)
    await svc.check_params(params, request)
    stream = svc.streamer(ctx)
    jobs = [(ids, p) for ids in prompt_ids for p in samples(drawn)]
    head = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": svc.reply_model(req.model),
    }
    prefix = [svc.engine.tokenizer.decode(ids) if req.echo else "" for ids in prompt_ids]

    def logprobs(
        i: int, ids: list[int], lps: list, tops: list, meta: dict | None = None, start: int = 0
    ) -> dict | None:
        """The listing of output tokens `ids` (text offsets from `start`), after the prompt's
        when echoed and `meta` (the output's last) is given."""
        if req.logprobs is None:
            return None
        tokens, lps, tops = list(ids), list(lps), [_top_by_text(svc, top) for top in tops]
        if req.echo and meta is not None:  # the prompt's tokens first; the first has none
            prompt_lps = meta.get("prompt_logprobs", [])
            prompt_tops = meta.get("prompt_top_logprobs") or [{} for _ in prompt_lps]
            tokens = jobs[i][0] + tokens
            lps = [None, *prompt_lps, *lps]
            tops = [None, *(_top_by_text(svc, top) for top in prompt_tops), *tops]
        texts = svc.token_texts(tokens)
        offsets = itertools.accumulate((len(t) for t in texts[:-1]), initial=start)
        return {
            "tokens": texts,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": list(offsets) if texts else [],
        }

    if req.stream:
        out_ids: list[list[int]] = [[] for _ in jobs]
        sent = [0 for _ in jobs]  # characters of the choice's text sent so far

        def render(i: int, chunk: StreamChunk) -> Iterable[dict]:
            text = chunk.text
            first = not out_ids[i]
            if req.echo and first:  # the first chunk (every chunk is sent)
                text = prefix[i // params.n] + text
            out_ids[i] += chunk.token_ids
            # Each chunk its own tokens' logprobs, as OpenAI streams them (the echoed
            # prompt's go with the first chunk, which the engine sends before any output).
            lp = logprobs(
                i,
                chunk.token_ids,
                chunk.logprobs or [],
                chunk.top_logprobs or [],
                (chunk.meta or {}) if req.echo and first else None,
                sent[i],
            )
            sent[i] += len(text)
            choice = {
                "index": i,
                "text": text,
                "logprobs": lp,
                "finish_reason": chunk.finish_reason,
            }
            yield {**head, "object": "text_completion", "choices": [choice]}

        usage = _usage_chunk(req, head, "text_completion", params.n)
        listings = req.logprobs is not None
        response = event_stream(svc, jobs, stream, render, usage, listings)
        return _ignoring(response, ignored, "completions")

    outs = await unless_disconnected(request, svc.collect_all(jobs, stream))
    metas = [o.meta for o in outs]  # every sample counts in the usage
    jobs, outs = _best(jobs, outs, drawn.n, params.n)

    def reply() -> Response:
        choices = [
            {
                "index": i,
                "text": prefix[i // params.n] + out.text,
                "logprobs": logprobs(
                    i,
                    out.token_ids,
                    out.meta.get("logprobs", []),
                    out.meta.get("top_logprobs", []),
                    out.meta,
                ),
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

    response = await svc.build_reply(reply, req.logprobs is not None)
    return _ignoring(response, ignored, "completions")


async def chat_completions(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    req, params, ignored, ctx = _openai_request(request, obj, ChatCompletionRequest)
    conversation = Conversation(
        req.messages,
        tools=req.tools,
        tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        template_variables=req.chat_template_kwargs,
        thinking=chat_thinking(req),
    )
    field = _max_tokens_field(obj)
    prepared = await pipeline.prepare(
        svc, ctx, ConversationRequest(conversation, params, max_tokens_field=field), request
    )
    params, jobs = prepared.params, prepared.jobs
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": svc.reply_model(req.model),
    }

    def logprobs(ids: list[int], lps: list[float], tops: list[dict]) -> dict | None:
        if not params.wants_logprobs:
            return None
        content = []
        for text, lp, top in zip(svc.token_texts(ids), lps, tops, strict=True):
            alternatives = [
                {"token": t, "logprob": v, "bytes": list(t.encode())}
                for t, v in _top_by_text(svc, top).items()
            ]
            entry = {"token": text, "logprob": lp, "bytes": list(text.encode())}
            content.append({**entry, "top_logprobs": alternatives})
        return {"content": content}

    if req.stream:
        replies = [prepared.reply() for _ in jobs]
        started = [False for _ in jobs]
        # Each token's logprob goes out with the first chunk sent after it was sampled (a
        # chunk whose text is held back, or a call not yet whole, sends none).
        pending = [_PendingLogprobs() for _ in jobs]

        def render(i: int, chunk: StreamChunk) -> Iterable[dict]:
            pending[i].add(chunk)
            reply = replies[i]
            delta = _delta(reply, reply.read(chunk.text, chunk.finish_reason))
            finish = reply.finish_reason
            if req.legacy_functions:
                delta = _legacy_delta(delta)
                finish = "function_call" if finish == "tool_calls" else finish
            if not started[i]:  # the first chunk carries the role, whatever else it has
                started[i] = True
                delta = {"role": "assistant", **delta}
            elif not delta and finish is None:
                return
            if not reply.parsed and not delta.keys() & {"content", "reasoning_content"}:
                delta["content"] = ""
            choice = {
                "index": i,
                "delta": delta,
                "logprobs": logprobs(*pending[i].take()),
                "finish_reason": finish,
            }
            yield {**head, "object": "chat.completion.chunk", "choices": [choice]}

        usage = _usage_chunk(req, head, "chat.completion.chunk", params.n)
        listings = params.wants_logprobs
        response = event_stream(svc, jobs, prepared.stream, render, usage, listings)
        return _ignoring(response, ignored, "chat/completions")

    outs = await unless_disconnected(request, svc.collect_all(jobs, prepared.stream))

    def reply() -> Response:
        choices = []
        for i, out in enumerate(outs):
            parsed = prepared.reply()
            parsed.read(out.text, out.finish_reason)
            message, finish = _message(parsed), parsed.finish_reason
            if req.legacy_functions:
                message, finish = _legacy_message(message, finish)
            lps, tops = out.meta.get("logprobs", []), out.meta.get("top_logprobs", [])
            listing = logprobs(out.token_ids, lps, tops)
            choices.append(
                {"index": i, "message": message, "logprobs": listing, "finish_reason": finish}
            )
        body = {
            **head,
            "object": "chat.completion",
            "choices": choices,
            "usage": _usage([o.meta for o in outs], params.n),
        }
        return JSONResponse(body)

    response = await svc.build_reply(reply, params.wants_logprobs)
    return _ignoring(response, ignored, "chat/completions")


def _message(reply: Reply) -> dict[str, Any]:
    """A whole output as a chat message: its text, or its calls (those whole) as tool_calls;
    its thought (where the reply shows it) as reasoning_content and its alias reasoning."""
    message: dict[str, Any] = {"role": "assistant"}
    message["content"] = reply.text if reply.is_text else (reply.text or None)
    if reply.shows_reasoning:
        thought = reply.reasoning or None
        message |= {"reasoning_content": thought, "reasoning": thought}
    if reply.calls:
        message["tool_calls"] = [c.as_json() for c in reply.calls]
    return message


def _delta(reply: Reply, events: list[tuple]) -> dict[str, Any]:
    """The streamed chunk's delta for these events: the thought as reasoning_content (and
    reasoning), text as content, each whole call as one OpenAI tool_calls piece (its id,
    type, name and arguments)."""
    thought = "".join(e[1] for e in events if e[0] == "reasoning")
    content = "".join(e[1] for e in events if e[0] == "text")
    pieces: list[dict[str, Any]] = []
    for e in events:
        if e[0] == "call":
            call = reply.calls[e[1]]
            function = {"name": call.name, "arguments": ""}
            pieces.append({"index": e[1], "id": call.id, "type": "function", "function": function})
        elif e[0] == "arguments":
            if pieces and pieces[-1]["index"] == e[1]:
                pieces[-1]["function"]["arguments"] += e[2]
            else:
                pieces.append({"index": e[1], "function": {"arguments": e[2]}})
    out: dict[str, Any] = {}
    if thought:
        out |= {"reasoning_content": thought, "reasoning": thought}
    if content:
        out["content"] = content
    if pieces:
        out["tool_calls"] = pieces
    return out


def _legacy_message(message: dict[str, Any], finish: str | None) -> tuple[dict, str | None]:
    """A chat message as the legacy functions API answers: its one call as function_call."""
    calls = message.pop("tool_calls", None)
    if calls:
        message["function_call"] = calls[0]["function"]
    return message, "function_call" if finish == "tool_calls" else finish


def _legacy_delta(delta: dict[str, Any]) -> dict[str, Any]:
    """A streamed delta as the legacy functions API sends it (its one call whole)."""
    pieces = delta.pop("tool_calls", None)
    if pieces:
        delta["function_call"] = pieces[0]["function"]
    return delta


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


class _PendingLogprobs:
    """A streamed choice's tokens and logprobs not yet sent."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.tops: list[dict[int, float]] = []

    def add(self, chunk: StreamChunk) -> None:
        self.ids += chunk.token_ids
        self.lps += chunk.logprobs or []
        self.tops += chunk.top_logprobs or []

    def take(self) -> tuple[list[int], list[float], list[dict[int, float]]]:
        taken = self.ids, self.lps, self.tops
        self.ids, self.lps, self.tops = [], [], []
        return taken


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
        # Tokens before the answer, the thought's markers among them (the engine's count).
        "completion_tokens_details": {
            "reasoning_tokens": sum(m.get("reasoning_tokens", 0) for m in metas)
        },
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
