"""POST /tokenize and /detokenize in vLLM's shapes, and in llama.cpp's where its fields differ:
a request is answered in the shape of the fields it used."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from braid.runtime import template_render
from braid.runtime.server.service import Service
from braid.runtime.server.wire import BadRequest, ChatMessage, convert, decode_object


class TokenizePrompt(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's text form."""

    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's chat form: the conversation through the model's chat template, as
    /v1/chat/completions renders one without tools."""

    messages: list[ChatMessage]
    model: str | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # the template writes the special tokens itself
    return_token_strs: bool = False


class TokenizeContent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """llama.cpp's form."""

    content: str
    model: str | None = None
    add_special: bool = False


class Detokenize(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tokens: list[int]
    model: str | None = None


async def tokenize(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    svc.check_model(obj.get("model"))
    tokenizer = svc.engine.tokenizer
    if "content" in obj:
        req = convert(obj, TokenizeContent)
        svc.check_text_length(len(req.content), "content")
        ids = await _encode(svc, req.content, req.add_special)
        return JSONResponse({"tokens": ids})
    if "messages" in obj:
        req = convert(obj, TokenizeChat)
        messages = [m.as_dict() for m in req.messages]
        svc.check_text_length(sum(len(m["content"]) for m in messages), "messages")
        text = await _render(svc, messages, req.add_generation_prompt)
        svc.check_text_length(len(text), "the conversation as the chat template renders it")
    else:
        req = convert(obj, TokenizePrompt)
        svc.check_text_length(len(req.prompt), "prompt")
        text = req.prompt
    ids = await _encode(svc, text, req.add_special_tokens)
    return JSONResponse(
        {
            "count": len(ids),
            "max_model_len": svc.engine.context_length,
            "tokens": ids,
            "token_strs": tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None,
        }
    )


async def detokenize(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    svc.check_model(obj.get("model"))
    req = convert(obj, Detokenize)
    size = len(svc.engine.tokenizer)
    bad = [t for t in req.tokens if not 0 <= t < size]
    if bad:
        raise BadRequest(f"tokens must be ids in [0, {size}) (the vocabulary); got {bad[:5]}")
    text = await svc.off_loop(svc.engine.tokenizer.decode, req.tokens)
    # Both servers take the same request: vLLM's answer names the text `prompt`, llama.cpp's
    # `content`.
    return JSONResponse({"prompt": text, "content": text})


async def _encode(svc: Service, text: str, special_tokens: bool) -> list[int]:
    """Tokenize off the event loop (as the generating routes do)."""
    tokenizer = svc.engine.tokenizer
    return await svc.off_loop(lambda: tokenizer.encode(text, add_special_tokens=special_tokens))


async def _render(svc: Service, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    """The conversation's text through the model's chat template."""

    def render() -> str:
        return template_render.render(
            svc.engine.tokenizer, messages, add_generation_prompt=generation_prompt
        )

    try:
        return await svc.off_loop(render)
    except Exception as e:  # the template refused the conversation (a system message...)
        raise BadRequest(f"the model's chat template cannot render these messages: {e}") from None


ROUTES = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
