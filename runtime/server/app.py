"""The ASGI app: routes, error replies, the API key check, and the engine's lifetime."""

from __future__ import annotations

import contextlib
import hmac

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runtime.engine import Engine
from runtime.server import native_routes, openai_routes
from runtime.server.service import ClientGone, Overloaded, Service
from runtime.server.wire import error_body

# Routes a load balancer or a scraper may call without the API key.
_OPEN_PATHS = frozenset({"/health", "/metrics"})


def create_app(
    engine: Engine,
    model_name: str,
    api_key: str | None = None,
    max_queued_requests: int = 1024,
    owns_engine: bool = False,
) -> Starlette:
    """An app serving `engine`; with `owns_engine` the engine is shut down with the app,
    after the server has drained its in-flight requests."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        if owns_engine:
            engine.shutdown()

    app = Starlette(
        routes=openai_routes.ROUTES + native_routes.ROUTES,
        middleware=[Middleware(_ApiKey, key=api_key)] if api_key else [],
        exception_handlers={
            ValueError: _reply(400, "invalid_request_error"),  # BadRequest and the engine's
            Overloaded: _reply(503, "overloaded"),
            ClientGone: _reply(499, "client_closed_request"),  # nobody reads it
            HTTPException: _http_exception,
            Exception: _reply(500, "server_error"),  # uvicorn logs its traceback
        },
        lifespan=lifespan,
    )
    app.state.service = Service(engine, model_name, max_queued_requests)
    return app


def _reply(status: int, kind: str):
    async def handler(request: Request, exc: Exception) -> Response:
        return JSONResponse(error_body(status, kind, str(exc) or type(exc).__name__), status)

    return handler


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    return JSONResponse(
        error_body(exc.status_code, "invalid_request_error", exc.detail), exc.status_code
    )


class _ApiKey:
    """Every route but the open ones needs `Authorization: Bearer <key>` (what the openai
    client sends)."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = error_body(401, "authentication_error", "missing or wrong API key")
                await JSONResponse(body, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
