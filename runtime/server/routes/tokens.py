"""POST /tokenize and /detokenize in vLLM's shapes, and in llama.cpp's where its fields differ:
a request is answered in the shape of the fields it used."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from braid.runtime.server.service import Service
from braid.runtime.server.wire import BadRequest, ChatMessage, convert, decode_object
from braid.runtime.text.tokenizer import adds_bos


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
        # As the chat routes tokenize a conversation (special tokens its text spells are
        # text), so that `count` is their prompt's.
        ids = await svc.render_chat(messages, add_generation_prompt=req.add_generation_prompt)
        if req.add_special_tokens and adds_bos(tokenizer):
            ids = [tokenizer.bos_token_id, *ids]
    else:
        req = convert(obj, TokenizePrompt)
        svc.check_text_length(len(req.prompt), "prompt")
        ids = await _encode(svc, req.prompt, req.add_special_tokens)
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


ROUTES = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
