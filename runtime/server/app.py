"""The ASGI app: routes, error replies, the API key check, and the engine's lifetime."""

from __future__ import annotations

import contextlib
import hmac
import re
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from braid.runtime.config import RequestLimits
from braid.runtime.engine.engine import Engine
from braid.runtime.server import dashboard, openapi
from braid.runtime.server.http import guards
from braid.runtime.server.http.connections import RETRY_AFTER_S
from braid.runtime.server.http.disconnects import ClientGone
from braid.runtime.server.http.idle_trim import TrimWhenIdle
from braid.runtime.server.request_context import set_tenant
from braid.runtime.server.routes import anthropic as anthropic_routes
from braid.runtime.server.routes import embeddings as embedding_routes
from braid.runtime.server.routes import native as native_routes
from braid.runtime.server.routes import openai as openai_routes
from braid.runtime.server.routes import responses as responses_routes
from braid.runtime.server.routes import tokens as token_routes
from braid.runtime.server.service import Overloaded, Service
from braid.runtime.server.wire import ModelNotFound, refusal_body

# Routes a load balancer or a scraper may call without the API key.
_OPEN_PATHS = frozenset({"/health", "/metrics"})
# Routes that act on the whole server, not on one client's requests (flushing every
# tenant's cache, loading adapters from its disk): the admin key's, where there is one.
ADMIN_PATHS = frozenset({"/flush_cache", "/load_lora_adapter", "/unload_lora_adapter"})
# Who shares cached prefixes: every request (apart from those giving a cache_salt), or the
# requests of one API key only.
CACHE_SCOPES = ("shared", "key")


# A request body larger than this gets a 413 before it is read whole. A prompt that fits a
# 128k-token context is under 2 MB of text, while reading a body costs many times its size.
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024


def create_app(
    engine: Engine,
    model_name: str,
    api_key: str | Sequence[str] | None = None,
    max_queued_requests: int = 1024,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    owns_engine: bool = False,
    accept_any_model: bool = False,
    limits: RequestLimits | None = None,
    aliases: tuple[str, ...] = (),
    cache_scope: str = "shared",
    allowed_hosts: frozenset[str] | None = None,
    allowed_origins: frozenset[str] = frozenset(),
    lora_updates: bool = False,
    admin_api_key: str | None = None,
) -> Starlette:
    """An app serving `engine` as `model_name` (and as each of `aliases`); with `owns_engine`
    the engine is shut down with the app, after the server has drained its in-flight
    requests. OpenAI requests naming another model get a 404, unless `accept_any_model` (for
    clients that hard-code a name). `limits` bound what one request may ask for (default:
    RequestLimits()). `api_key`: the key every route but /health and /metrics needs, or
    several (any one of them will do); with `cache_scope` "key" each key's requests share
    cached prefixes only with each other. Requests with a Host outside `allowed_hosts` (None:
    any), an Origin outside `allowed_origins`, or a body that is not JSON are refused
    (server/guards.py). `lora_updates`: serve /load_lora_adapter and /unload_lora_adapter,
    which load adapters from any path the server can read. `admin_api_key`: the one key the
    admin routes (ADMIN_PATHS) take; without it they take the API keys, except under
    cache_scope "key", where no tenant may act on the others' (they are a 403 then)."""
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    if cache_scope not in CACHE_SCOPES:
        raise ValueError(
            f"cache_scope must be one of {', '.join(CACHE_SCOPES)}; got {cache_scope!r}"
        )
    if cache_scope == "key" and not keys:
        raise ValueError("cache_scope 'key' scopes the prefix cache by API key: give the keys")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        if owns_engine:
            engine.shutdown()

    app = Starlette(
        routes=route_table(lora_updates),
        middleware=[Middleware(TrimWhenIdle)]
        + guards.middleware(allowed_hosts, allowed_origins)
        + [Middleware(_BodyLimit, max_bytes=max_request_bytes)]
        + (
            [Middleware(ApiKey, keys=keys, scoped=cache_scope == "key", admin=admin_api_key)]
            if keys or admin_api_key
            else []
        ),
        exception_handlers={
            ValueError: _reply(400, "invalid_request_error"),  # BadRequest and the engine's
            ModelNotFound: _reply(404, "invalid_request_error", "model_not_found"),
            BodyTooLarge: _reply(413, "request_too_large"),
            Overloaded: _reply(503, "overloaded"),
            ClientGone: _reply(499, "client_closed_request"),  # nobody reads it
            404: _not_found,  # no route matched
            HTTPException: _http_exception,
            Exception: _reply(500, "server_error"),  # uvicorn logs its traceback
        },
        lifespan=lifespan,
    )
    app.state.service = Service(
        engine, model_name, max_queued_requests, limits, aliases, accept_any_model
    )
    app.state.dashboard = dashboard.Dashboard(engine, lists_requests=cache_scope != "key")
    return app


def route_table(lora_updates: bool = False) -> list[Route]:
    """The routes create_app serves (/load_lora_adapter and /unload_lora_adapter only with
    `lora_updates`)."""
    return (
        openai_routes.ROUTES
        + responses_routes.ROUTES
        + anthropic_routes.ROUTES
        + embedding_routes.ROUTES
        + token_routes.ROUTES
        + native_routes.ROUTES
        + dashboard.ROUTES
        + (native_routes.LORA_ROUTES if lora_updates else [])
        + openapi.ROUTES
    )


def _reply(status: int, kind: str, code: str | None = None):
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None

    async def handler(request: Request, exc: Exception) -> Response:
        message = str(exc) or type(exc).__name__
        body = refusal_body(request.url.path, status, kind, message, code)
        return JSONResponse(body, status, headers=headers)

    return handler


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    body = refusal_body(request.url.path, exc.status_code, "invalid_request_error", exc.detail)
    return JSONResponse(body, exc.status_code)


# A path parameter's converter, which a listing of the routes leaves out: {id:path} -> {id}.
_CONVERTER = re.compile(r":\w+}")


async def _not_found(request: Request, exc: HTTPException) -> Response:
    """OpenAI's error shape, with the routes there are: a client that got a path wrong (a
    missing /v1, a typo) sees the right one."""
    routes = [
        f"{method} {_CONVERTER.sub('}', route.path)}"
        for route in request.app.routes
        if isinstance(route, Route)
        for method in sorted(route.methods - {"HEAD"})  # starlette adds HEAD to every GET
    ]
    message = f"no route {request.method} {request.url.path}; the routes are: {', '.join(routes)}"
    body = refusal_body(request.url.path, 404, "invalid_request_error", message, "not_found")
    return JSONResponse(body, 404)


class BodyTooLarge(Exception):
    """The request body is over the server's limit: a 413."""


class _BodyLimit:
    """Refuses a body over `max_bytes`: at once when its Content-Length says so, else as soon
    as the bytes read pass it (the route reading the body gets BodyTooLarge)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.message = (
            f"the request body is over the server's limit of {max_bytes} bytes "
            "(--max-request-bytes)"
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_bytes:
            body = refusal_body(scope["path"], 413, "request_too_large", self.message)
            await JSONResponse(body, 413)(scope, receive, send)
            return
        received = 0

        async def limited():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLarge(self.message)
            return message

        await self.app(scope, limited, send)


class ApiKey:
    """Every route but the open ones needs one of the keys, as `Authorization: Bearer <key>`
    (what the openai client sends) or `x-api-key: <key>` (what the anthropic client sends).
    `scoped` (--cache-scope key): each key is a tenant of its own, whose requests share cached
    prefixes only with each other (its place in the list is the tenant of every request
    it makes: request_context.set_tenant). The admin routes take the `admin` key alone where
    there is one (as SGLang's --admin-api-key), else the keys, unless `scoped`: a tenant's
    key never flushes the others' cache."""

    def __init__(
        self, app, keys: Sequence[str], scoped: bool = False, admin: str | None = None
    ) -> None:
        self.app = app
        self.keys = [_accepted(key) for key in keys]
        self.admin = None if admin is None else [_accepted(admin)]
        self.scoped = scoped

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if path in ADMIN_PATHS and (self.admin is not None or self.scoped):
            if self.admin is None or not any(_matches(scope, self.admin)):
                await self._admin_only(path)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if not self.keys:  # only an admin key: the other routes are open
            await self.app(scope, receive, send)
            return
        matches = _matches(scope, self.keys)
        if not any(matches):
            message = "missing or wrong API key"
            body = refusal_body(path, 401, "authentication_error", message)
            await JSONResponse(body, 401)(scope, receive, send)
            return
        if self.scoped:
            set_tenant(scope, str(matches.index(True)))  # the key's place in the list
        await self.app(scope, receive, send)

    def _admin_only(self, path: str) -> Response:
        message = f"{path} acts on the whole server: it needs the admin API key (--admin-api-key)"
        if self.admin is None:
            message += (
                ", which this server was not given: under --cache-scope key no tenant's key "
                "acts on the others' requests"
            )
        return JSONResponse(refusal_body(path, 403, "permission_error", message), 403)


def _accepted(key: str) -> tuple[bytes, bytes]:
    """A key as each header carries it: `Authorization: Bearer <key>`, `x-api-key: <key>`."""
    return f"Bearer {key}".encode(), key.encode()


def _matches(scope, keys: list[tuple[bytes, bytes]]) -> list[bool]:
    """Whether the request carries each of `keys`. Every key is compared in constant time,
    whichever header is given (`|` does not short-circuit): the time taken tells nothing of
    which key matched, or how nearly."""
    headers = dict(scope["headers"])
    bearer, given = headers.get(b"authorization", b""), headers.get(b"x-api-key", b"")
    given = given or dashboard.key_in_query(scope)  # a browser opening the dashboard
    return [hmac.compare_digest(bearer, b) | hmac.compare_digest(given, k) for b, k in keys]
