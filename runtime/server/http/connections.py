"""Connection limits, kept in uvicorn's HTTP protocol (below the app): deadlines for a
request's headers and for its body, a bound on open connections that fits under the process's
file-descriptor limit, and one quiet log line, not a traceback per try, when accepting a
connection fails for lack of descriptors.

uvicorn has neither deadline nor such a bound: a client that sent its headers a byte at a
time, or nothing, held its connection and a descriptor for good, and more silent sockets than
descriptors left every later connection unaccepted (/health timed out) while asyncio logged a
traceback for each failed accept (docs/reliability.md). uvicorn's own `limit_concurrency` does
not help: it is checked only once a request's headers are in, which a silent socket never
sends.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import resource
import time
from dataclasses import dataclass, field, fields
from http import HTTPStatus
from typing import Any, ClassVar

import msgspec
from uvicorn.protocols.http.h11_impl import H11Protocol

from braid.runtime.server.wire import error_body

log = logging.getLogger("braid.serve")

# The listen queue, and how many connections asyncio accepts in one turn of its loop; those
# are counted (connection_made) only a turn or two later, so they may pass the bound meanwhile.
BACKLOG = 128
# A 503's Retry-After: a full server or compile queue drains within seconds, and clients that
# honour it (the official SDKs retry with it) come back then rather than at once.
RETRY_AFTER_S = 1
# Descriptors left free beyond the connections: a few accept batches not yet counted, and
# the process's own files, pipes and compile workers (an idle server holds about 10).
_SPARE_DESCRIPTORS = 4 * BACKLOG + 128


def _setting(default, help: str):
    """A field and its meaning (`braid serve --help` prints it)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request and how many connections the server
    holds open (`braid serve` flags)."""

    header_timeout_s: float = _setting(
        30.0,
        "seconds a request's headers may take to arrive, counted from the connection's start "
        "or the previous response; later, a 408 and the connection is closed",
    )
    body_timeout_s: float = _setting(
        60.0,
        "seconds a request's body may take to arrive after its headers, in all (bytes "
        "trickling in do not extend it); later, a 408 and the connection is closed",
    )
    keep_alive_timeout_s: float = _setting(
        5.0, "seconds an idle connection is kept open for the client's next request"
    )
    write_timeout_s: float = _setting(
        30.0,
        "seconds a response may wait for its client to read (the socket's buffers full); "
        "later, the connection is dropped and the request's places freed",
    )
    shutdown_timeout_s: float = _setting(
        30.0,
        "seconds SIGTERM waits for the requests in flight to finish; later, they are "
        "cancelled (their engine requests aborted, their compiles dropped) and the server "
        "stops. A second SIGTERM or Ctrl+C stops it at once",
    )
    max_connections: int = _setting(
        2048,
        "open connections; past it a new one closes the connection idle longest (or still "
        "sending its headers), or gets a 503 when every one has a request in flight; lowered "
        "at start to fit the file-descriptor limit",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"ConnectionLimits.{f.name} must be > 0, got {value}")


def from_flags(args: argparse.Namespace) -> ConnectionLimits:
    return ConnectionLimits(**{f.name: getattr(args, f.name) for f in fields(ConnectionLimits)})


def prepare(limits: ConnectionLimits) -> dict[str, Any]:
    """uvicorn.run's settings for `limits`, fitted to this process's descriptor limit (raised
    as far as they need, within the hard limit); asyncio's accept errors are quietened."""
    quiet_accept_errors()
    return uvicorn_options(fit_descriptor_limit(limits))


def uvicorn_options(limits: ConnectionLimits) -> dict[str, Any]:
    """The uvicorn.run / uvicorn.Config settings that enforce `limits`, as they are."""
    protocol = type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "idle": {}})
    return {
        "http": protocol,
        "ws": "none",  # no route takes a WebSocket: an upgrade would skip the deadlines
        "timeout_keep_alive": limits.keep_alive_timeout_s,
        "timeout_graceful_shutdown": limits.shutdown_timeout_s,
        "backlog": BACKLOG,
    }


def fit_descriptor_limit(limits: ConnectionLimits) -> ConnectionLimits:
    """Raise the soft descriptor limit as far as `limits.max_connections` needs (within the
    hard limit), and lower max_connections to what fits under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits
    wanted = limits.max_connections + _SPARE_DESCRIPTORS
    if soft < wanted and soft != hard:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):  # macOS caps it below an infinite hard limit
            pass
    fits = soft - min(_SPARE_DESCRIPTORS, soft // 2)
    if fits >= limits.max_connections:
        return limits
    log.warning(
        "the file-descriptor limit (ulimit -n) is %d: at most %d connections open, not "
        "--max-connections %d",
        soft,
        fits,
        limits.max_connections,
    )
    return dataclasses.replace(limits, max_connections=fits)


class _Throttle:
    """At most one log line per `every_s` seconds; those held back are counted."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self.last = -every_s
        self.held = 0

    def ready(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.every_s:
            self.held += 1
            return False
        self.last = now
        return True

    def since(self) -> str:
        """How many were held back since the last line (then counts again from 0)."""
        held, self.held = self.held, 0
        return f" ({held} more since the last such message)" if held else ""


class _AcceptErrors(logging.Filter):
    """asyncio logs a traceback for each accept that fails for lack of descriptors, up to its
    backlog per turn of the loop, every turn: one line a minute instead, with a count."""

    def __init__(self) -> None:
        super().__init__()
        self.throttle = _Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("socket.accept() out of system resource"):
            return True
        if not self.throttle.ready():
            return False
        error = record.exc_info[1] if record.exc_info else None
        record.msg = (
            f"cannot accept connections: {error or 'out of a system resource'}; asyncio "
            "tries again every second (the descriptor limit is ulimit -n; --max-connections "
            f"bounds the connections under it){self.throttle.since()}"
        )
        record.args, record.exc_info, record.exc_text = (), None, None
        return True


_ACCEPT_ERRORS = _AcceptErrors()


def quiet_accept_errors() -> None:
    logging.getLogger("asyncio").addFilter(_ACCEPT_ERRORS)  # once, however often called


_evictions = _Throttle()
_stalls = _Throttle()  # clients that stopped reading

# What a connection owes the server now, and the ConnectionLimits field that bounds it.
_DEADLINES = {"headers": "header_timeout_s", "body": "body_timeout_s"}


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers (from the
    connection's start or the previous response) and for its body (from its headers), one
    for a response its client does not read (a stream held by a client that never reads
    would hold its places in the server for ever), and a bound on open connections.
    `uvicorn_options` makes a subclass for each server, which sets `limits` and its own
    `idle`."""

    limits: ClassVar[ConnectionLimits]
    # The server's connections without a request in flight (between requests, or still
    # sending headers), the longest idle first: which to close for a new one, found at once.
    idle: ClassVar[dict[GuardedH11Protocol, None]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline: asyncio.TimerHandle | None = None
        self.owed: str | None = None  # "headers", "body", or None while a request is served
        self.unread: asyncio.TimerHandle | None = None  # while writing is paused

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._owe("headers")
        if len(self.connections) > self.limits.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._owe(None)
        self._read_again()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.unread is None:
            seconds = self.limits.write_timeout_s
            self.unread = self.loop.call_later(seconds, self._not_read, seconds)

    def resume_writing(self) -> None:
        self._read_again()
        super().resume_writing()

    def _read_again(self) -> None:
        if self.unread is not None:
            self.unread.cancel()
            self.unread = None

    def _not_read(self, seconds: float) -> None:
        """The client has read nothing for `seconds`: drop the connection (abort: closing
        would wait for the unread bytes to go), which ends its request and frees its places."""
        self.unread = None
        if _stalls.ready():
            log.warning(
                "a client read nothing of its response for %g s (--write-timeout-s): "
                "connection dropped%s",
                seconds,
                _stalls.since(),
            )
        self.transport.abort()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived: now its body, if any
            self._owe("body" if self.cycle.more_body else None)
        elif self.owed == "body" and not self.cycle.more_body:
            self._owe(None)

    def on_response_complete(self) -> None:
        # Before uvicorn's own, which may go on to a pipelined request's headers.
        self._owe("headers")
        super().on_response_complete()

    def _owe(self, part: str | None) -> None:
        """The client now owes `part` of a request, within its deadline (None: nothing)."""
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.owed = part
        self.idle.pop(self, None)
        if part == "headers":
            self.idle[self] = None  # the newest last
        if part is not None:
            seconds = getattr(self.limits, _DEADLINES[part])
            self.deadline = self.loop.call_later(seconds, self._late, part, seconds)

    def _late(self, part: str, seconds: float) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started and part == "body":
            self.transport.close()  # a 408 cannot follow the answer already under way
            return
        flag = "--" + _DEADLINES[part].replace("_", "-")
        message = f"the request's {part} did not arrive within {seconds:g} s ({flag})"
        self._refuse(408, "timeout", message)

    def _make_room(self) -> None:
        """Over the bound: close the connection idle longest (between requests, or still
        sending headers); when every other one has a request in flight, refuse this one."""
        bound = self.limits.max_connections
        oldest = next(iter(self.idle))
        if oldest is not self:
            self.idle.pop(oldest)
            oldest.transport.close()
            if _evictions.ready():
                log.warning(
                    "%d connections open (--max-connections): closing the longest idle for "
                    "each new one%s",
                    bound,
                    _evictions.since(),
                )
            return
        message = (
            f"the server has {bound} connections open (--max-connections), each with a request "
            "in flight; retry later"
        )
        self._refuse(503, "overloaded", message)

    def _refuse(self, status: int, kind: str, message: str) -> None:
        """Answer `status` and close, whatever h11 has read of a request (maybe none)."""
        body = msgspec.json.encode(error_body(status, kind, message))
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
            + (f"retry-after: {RETRY_AFTER_S}\r\n" if status == 503 else "")
            + "connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()
