"""POST /v1/embeddings, in OpenAI's shape: the served generative model's embeddings (its final
normed hidden states, mean-pooled and L2-normalized, as llama.cpp's server gives them)."""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from braid.runtime.server.http.disconnects import unless_disconnected
from braid.runtime.server.service import Service
from braid.runtime.server.wire import BadRequest, convert, decode_object


class EmbeddingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # A string, a list of strings, a list of token ids, or a list of lists of token ids.
    input: str | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None  # only the model's hidden size: vectors are not shortened
    user: str | None = None  # accepted, unused


async def embeddings(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    if svc.check_model(obj.get("model")) is not None:
        raise BadRequest("embeddings come from the base model; name it, not a LoRA adapter")
    req = convert(obj, EmbeddingRequest)
    hidden = svc.engine.model_config.hidden_size
    if req.dimensions is not None and req.dimensions != hidden:
        raise BadRequest(
            f"dimensions is {req.dimensions}; this model's embeddings have {hidden} (its hidden "
            "size), and braid does not shorten them"
        )
    inputs = _inputs(req.input)
    svc.check_room(len(inputs))  # before anything is tokenized
    ids_list = [await _ids(svc, x, f"input[{i}]") for i, x in enumerate(inputs)]
    with svc.admit(len(inputs)):
        vectors = await unless_disconnected(request, svc.engine.aembed(ids_list))
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    num_tokens = sum(len(ids) for ids in ids_list)
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": svc.reply_model(req.model),
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }
    )


def _inputs(given: str | list[Any]) -> list[str | list[int]]:
    """The request's inputs, each text or token ids."""
    if isinstance(given, str):
        return [given]
    if not given:
        raise BadRequest("input must not be empty")
    if all(_is_id(t) for t in given):
        return [given]
    if all(isinstance(x, str) for x in given) or all(
        isinstance(x, list) and all(_is_id(t) for t in x) for x in given
    ):
        return list(given)
    raise BadRequest(
        "input must be a string, a list of strings, a list of token ids, or a list of lists of "
        "token ids"
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def _ids(svc: Service, given: str | list[int], field: str) -> list[int]:
    """An input's token ids (text tokenized as a prompt is, off the event loop), within
    --max-prompt-tokens; Engine.embed checks the rest (vocabulary, context, KV pool)."""
    if not given:
        raise BadRequest(f"{field} is empty")
    if isinstance(given, str):
        svc.check_text_length(len(given), field)
        given = await svc.off_loop(svc.engine.tokenizer.encode, given)
    bound = svc.limits.max_prompt_tokens
    if bound is not None and len(given) > bound:
        raise BadRequest(
            f"{field} has {len(given)} tokens; this server allows at most {bound} "
            "(--max-prompt-tokens)"
        )
    return given


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """base64: the little-endian float32 bytes, which OpenAI's SDK decodes."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


ROUTES = [Route("/v1/embeddings", embeddings, methods=["POST"])]
