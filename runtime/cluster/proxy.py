"""Relaying a request to the router or a replica, and its answer back, streams included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import httpx
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from braid.runtime.server.http.disconnects import ClientGone, unless, unless_disconnected
from braid.runtime.server.wire import error_body

# Headers that belong to one connection, or that the front sets itself.
_HOP_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "authorization",
        "accept-encoding",  # so the bytes relayed are never compressed
        "content-encoding",
        "origin",  # the front has judged it (server/guards.py); a replica would refuse it
    }
)
_DONE = b"data: [DONE]"
# How often a request waiting on an upstream looks whether it was found down.
_DOWN_POLL_S = 0.2
T = TypeVar("T")


class UpstreamDown(Exception):
    """The upstream was found down (failing its health checks) before its answer began: the
    request may be sent elsewhere, nothing of it having reached the client."""


async def _until(down: Callable[[], bool]) -> None:
    while not down():
        await asyncio.sleep(_DOWN_POLL_S)


async def forward(
    request: Request,
    client: httpx.AsyncClient,
    auth: dict[str, str],
    base_url: str,
    body: bytes,
    upstream_name: str,
    on_done: Callable[[], None] = lambda: None,
    down: Callable[[], bool] = lambda: False,
    down_ends_stream: bool = False,
) -> Response:
    """Send the request on to `base_url` (with the `auth` headers instead of the client's)
    and relay the answer; a stream is relayed as it comes. `on_done` runs once the upstream
    answer is over, however it ended. A client that leaves before its answer is whole closes
    the upstream request, so the replica aborts it (starlette notices for a stream; this
    watches the wait for the upstream's headers and the read of a whole answer).

    `down`: whether the upstream was found down. Before its answer begins that raises
    UpstreamDown (a stopped replica holds its requests for as long as it is stopped, so
    they are sent elsewhere); with `down_ends_stream` a stream relayed meanwhile ends with
    an error event then."""
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
    headers += list(auth.items())
    url = base_url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
    outgoing = client.build_request(request.method, url, headers=headers, content=body)
    sent = unless(client.send(outgoing, stream=True), _until(down), UpstreamDown)
    try:
        upstream = await _unless_client_leaves(request, sent)
    except httpx.HTTPError as e:
        on_done()
        message = f"{upstream_name} did not answer ({type(e).__name__}: {e}); retry later"
        return JSONResponse(error_body(503, "overloaded", message), 503)
    except UpstreamDown:
        on_done()
        raise
    if upstream is None:
        on_done()
        return _client_gone()
    reply_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return StreamingResponse(
            _relay(upstream, upstream_name, on_done, down if down_ends_stream else None),
            status_code=upstream.status_code,
            headers=reply_headers,
        )
    try:
        content = await _unless_client_leaves(request, upstream.aread())
    except httpx.HTTPError as e:
        message = f"{upstream_name} failed before answering ({type(e).__name__}: {e})"
        return JSONResponse(error_body(502, "server_error", message), 502)
    finally:
        await upstream.aclose()
        on_done()
    if content is None:
        return _client_gone()
    if upstream.status_code >= 400 and not _is_json(content):
        # The router's own errors are plain text: give them braid's (OpenAI's) error shape.
        status = upstream.status_code
        message = f"{upstream_name}: {content.decode(errors='replace').strip()}"
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return JSONResponse(error_body(status, kind, message), status)
    return Response(content, upstream.status_code, headers=reply_headers)


async def _relay(
    upstream: httpx.Response,
    upstream_name: str,
    on_done: Callable[[], None],
    down: Callable[[], bool] | None,
) -> AsyncIterator[bytes]:
    """The upstream's events as they come; if it breaks off before its `data: [DONE]` (or
    is found `down`), an error event and `[DONE]`, so the client knows the output is
    incomplete."""
    seen, failure = b"", None
    try:
        async for chunk in _chunks(upstream, down):
            seen = seen[-len(_DONE) :] + chunk
            yield chunk
    except httpx.HTTPError as e:
        failure = f"{type(e).__name__}: {e}"
    except UpstreamDown:
        failure = "it stopped answering its health checks"
    finally:
        await upstream.aclose()
        on_done()
    if _DONE not in seen:
        message = (
            f"{upstream_name} failed in the middle of this stream ({failure or 'it ended early'})"
        )
        yield b"data: " + msgspec.json.encode(error_body(502, "server_error", message)) + b"\n\n"
        yield _DONE + b"\n\n"


async def _chunks(
    upstream: httpx.Response, down: Callable[[], bool] | None
) -> AsyncIterator[bytes]:
    """The upstream's bytes as they come, until it is found `down` (UpstreamDown then)."""
    if down is None:
        async for chunk in upstream.aiter_raw():
            yield chunk
        return
    chunks = upstream.aiter_raw()
    while True:
        try:
            yield await unless(anext(chunks), _until(down), UpstreamDown)
        except StopAsyncIteration:
            return


async def _unless_client_leaves(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None if the client disconnects first: then `work` is cancelled,
    which closes its connection upstream, and the replica aborts the request as it does for
    any client that leaves (otherwise it decoded on, to max_tokens, for nobody)."""
    try:
        return await unless_disconnected(request, work)
    except ClientGone:
        return None


def _client_gone() -> Response:
    return Response(status_code=499)  # nobody reads it


def _is_json(content: bytes) -> bool:
    try:
        msgspec.json.decode(content)
    except msgspec.DecodeError:
        return False
    return True
