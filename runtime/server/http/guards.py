"""Refusing what a web page could make a browser send: the server answers no API key by
default, so any page a local user opens could otherwise drive it.

- DNS rebinding: a page re-resolves its own name to 127.0.0.1 and calls the server as its own
  origin. Its requests carry the page's name in Host, so a server bound to loopback answers
  only loopback names (Ollama's fix for the same attack); `--allowed-hosts` widens that.
- Cross-site requests: a browser sends `Origin` with every cross-origin POST (and with a
  preflight); one not in `--allowed-origins` is refused (CORS is off unless it lists some).
- A page may post a form or text/plain without a preflight: a body must be
  `application/json`. A body with no Content-Type is read as JSON (python's requests and
  httpx send raw bytes so; a browser that sends such a body sends Origin with it).
"""

from __future__ import annotations

import ipaddress

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from braid.runtime.server.wire import refusal_body

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
ANY = "*"


def allowed_hosts(bind_host: str, flag: str | None) -> frozenset[str] | None:
    """The Host names the server answers (None: any): `--allowed-hosts`'s comma list (`*`:
    any); without it, the loopback names when bound to a loopback address, else any."""
    if flag is not None:
        names = _names(flag)
        return None if ANY in names else names
    address = bind_host.strip("[]").lower()
    if address == "localhost" or _is_loopback_ip(address):
        return LOOPBACK_NAMES | {address}
    return None


def allowed_origins(flag: str | None) -> frozenset[str]:
    """`--allowed-origins`'s comma list of origins (scheme://host[:port]; `*`: any)."""
    return frozenset(o.rstrip("/") for o in _names(flag or ""))


def middleware(hosts: frozenset[str] | None, origins: frozenset[str]) -> list[Middleware]:
    """The guard, then (with allowed origins) CORS, which answers their preflights: both
    before the API key check, since a preflight carries no key."""
    guard = [Middleware(RequestGuard, hosts=hosts, origins=origins)]
    if not origins:
        return guard
    cors = Middleware(
        CORSMiddleware,
        allow_origins=[ANY] if ANY in origins else sorted(origins),
        allow_methods=[ANY],
        allow_headers=[ANY],
        expose_headers=[ANY],
    )
    return [*guard, cors]


class RequestGuard:
    """Refuses a Host not in `hosts` (None: any) and an Origin not in `origins` (403), and a
    body that is not JSON (415). It also ends quietly a request whose client left while
    sending its body (starlette raises ClientDisconnect: one traceback each otherwise)."""

    def __init__(self, app, hosts: frozenset[str] | None, origins: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope["headers"], scope.get("path", ""))
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            pass  # nobody to answer

    def _refusal(self, headers: list[tuple[bytes, bytes]], path: str) -> JSONResponse | None:
        body, media_type = False, b""
        for name, value in headers:
            text = value.decode("latin-1")
            if name == b"host" and self.hosts is not None and _host_name(text) not in self.hosts:
                return _refuse(
                    path,
                    403,
                    "permission_error",
                    "host_not_allowed",
                    f"Host {text!r} is not one this server answers ({', '.join(sorted(self.hosts))}"
                    "): it listens on loopback, where a web page could reach it through a name "
                    "of its own (DNS rebinding); start it with --allowed-hosts to allow others",
                )
            if name == b"origin" and ANY not in self.origins and _origin(text) not in self.origins:
                return _refuse(
                    path,
                    403,
                    "permission_error",
                    "origin_not_allowed",
                    f"Origin {text!r} is not allowed: requests from web pages are refused unless "
                    "the server is started with --allowed-origins listing their origin",
                )
            if name == b"content-length":
                body = body or value.strip() != b"0"
            elif name == b"transfer-encoding":
                body = True
            elif name == b"content-type":
                media_type = value.split(b";")[0].strip().lower()
        if body and media_type not in (b"", b"application/json"):
            return _refuse(
                path,
                415,
                "invalid_request_error",
                "unsupported_media_type",
                f"Content-Type {media_type.decode('latin-1')!r} is not accepted: send the body "
                "as JSON with Content-Type: application/json (curl: -H 'Content-Type: "
                "application/json')",
            )
        return None


def _refuse(path: str, status: int, kind: str, code: str, message: str) -> JSONResponse:
    return JSONResponse(refusal_body(path, status, kind, message, code), status)


def _names(flag: str) -> frozenset[str]:
    return frozenset(n.strip().lower() for n in flag.split(",") if n.strip())


def _is_loopback_ip(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """A Host header's name without its port: `[::1]:30000` -> `::1`, `localhost.` ->
    `localhost`."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _origin(origin: str) -> str:
    return origin.strip().lower().rstrip("/")
