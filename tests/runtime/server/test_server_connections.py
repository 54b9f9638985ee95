"""Attacks on the connection and at the door, each run while /health and normal requests are
watched: slow and silent connections (deadlines for a request's headers and body, a bound on
connections under the descriptor limit, one quiet line when descriptors run out), requests a
web page could send (a foreign Host, an Origin, a form or text/plain body), and at the `--dp`
front a body over the limit (refused before it is read whole) and a client that leaves (its
request is aborted on the replica)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping

import httpx
import pytest
import uvicorn
from conftest import LiveServer, ServeProcess, wait_for, wait_idle

from braid.runtime.server import create_app
from braid.runtime.server.http import connections, guards
from braid.runtime.server.http.connections import ConnectionLimits, uvicorn_options

# Short deadlines, so that the attacks below run out in seconds. Which deadline closed a
# connection is read from the 408 the server writes; how long it took is bounded only by the
# tests' waits, ten times the deadline or more, since a loaded machine is slow.
LIMITS = ConnectionLimits(header_timeout_s=1.0, body_timeout_s=2.0, keep_alive_timeout_s=1.0)
COMPLETION = {"prompt": "Hello", "max_tokens": 1}


class GuardedServer:
    """A braid app in uvicorn on loopback, in a thread, with `limits` set as `braid serve`
    sets them (LiveServer runs uvicorn as it comes)."""

    def __init__(self, engine, limits: ConnectionLimits = LIMITS, **app_options) -> None:
        app = create_app(engine, model_name="tiny", **app_options)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", **uvicorn_options(limits)
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="guarded", daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), 30, "the server")
        assert self.server.started, "the server did not start"
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(engine):
    server = GuardedServer(engine)
    yield server
    server.stop()


@contextlib.contextmanager
def watched(url: str) -> Iterator[None]:
    """Runs the block while another thread asks for /health and a one-token completion, each
    on a new connection, over and over (and once more after the block): every one must be
    answered with a 200."""
    failures: list[str] = []
    answered = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal answered
        while not stop.is_set():
            try:
                for reply in (
                    httpx.get(url + "/health", timeout=60),
                    httpx.post(url + "/v1/completions", json=COMPLETION, timeout=60),
                ):
                    if reply.status_code != 200:
                        failures.append(f"{reply.status_code} {reply.text}")
                answered += 1
            except httpx.HTTPError as e:
                failures.append(repr(e))
            stop.wait(0.1)

    thread = threading.Thread(target=poll, name="watcher")
    thread.start()
    try:
        yield
        after = answered + 1  # and a whole round begun once the block is over
        wait_for(lambda: answered > after or bool(failures), 20, "the watcher's round")
    finally:
        stop.set()
        thread.join()
    assert not failures, failures[:5]


_opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setblocking(False)
    _opened.append(s)
    return s


def _read_until_closed(
    sockets: list[socket.socket],
    timeout: float,
    trickle: Mapping[socket.socket, bytes] = {},
    until: int | None = None,
) -> dict:
    """Reads each socket until the server closes it (or until `until` of them are closed),
    meanwhile sending each socket in `trickle` the next byte of its bytes every 0.1 s;
    {socket: (bytes read, seconds until it closed)} for those closed within `timeout`."""
    start = time.monotonic()
    until = len(sockets) if until is None else until
    read = {s: b"" for s in sockets}
    closed: dict = {}
    poll = select.poll()  # select() takes no descriptor past 1,023
    by_fd = {s.fileno(): s for s in sockets}
    for fd in by_fd:
        poll.register(fd, select.POLLIN)
    sent = 0
    while len(closed) < until and time.monotonic() - start < timeout:
        for s in trickle.keys() - closed.keys():
            with contextlib.suppress(OSError):
                s.send(trickle[s][sent : sent + 1])
        sent += 1
        for fd, _ in poll.poll(100):
            s = by_fd[fd]
            try:
                data = s.recv(65536)
            except OSError:  # reset: closed all the same
                data = b""
            read[s] += data
            if not data:
                closed[s] = (read[s], time.monotonic() - start)
                poll.unregister(fd)
    return closed


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.messages.append(record.getMessage())


# A request's headers, sent a byte at a time and never finished.
SLOW_HEADERS = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: a\r\n" * 10_000


def test_slow_and_silent_connections_are_closed_at_the_header_deadline(server):
    silent = [_connect(server.port) for _ in range(7)]
    trickling = [_connect(server.port) for _ in range(7)]
    # Keep-alive: a request answered, then the next one's headers a byte at a time (each
    # byte used to reset uvicorn's keep-alive timer).
    kept = [_connect(server.port) for _ in range(7)]
    for s in kept:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    with watched(server.url):
        trickle = dict.fromkeys(trickling + kept, SLOW_HEADERS)
        closed = _read_until_closed(silent + trickling + kept, 20, trickle)
    assert len(closed) == 21, f"{21 - len(closed)} of 21 still open"
    for data, _ in closed.values():
        assert b"408 Request Timeout" in data, data
        assert b"headers did not arrive within 1 s (--header-timeout-s)" in data, data
    for s in kept:
        assert closed[s][0].startswith(b"HTTP/1.1 200 OK"), closed[s][0]


def test_a_body_trickling_in_is_closed_at_the_body_deadline(server):
    errors = _ListHandler()
    logging.getLogger("uvicorn.error").addHandler(errors)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    slow = [_connect(server.port) for _ in range(5)]
    for s in slow:
        s.sendall(head)
    try:
        with watched(server.url):
            body = b'{"prompt": "' + b"a" * 100_000
            closed = _read_until_closed(slow, 20, dict.fromkeys(slow, body))
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert len(closed) == 5, f"{5 - len(closed)} of 5 still open"
    for data, _ in closed.values():
        assert b"408 Request Timeout" in data and b"--body-timeout-s" in data, data
    # The route reading the body sees the client gone: no traceback for it.
    assert not errors.messages, errors.messages[:3]


def test_past_max_connections_the_longest_idle_are_closed(engine):
    server = GuardedServer(engine, ConnectionLimits(max_connections=32))
    try:
        silent = [_connect(server.port) for _ in range(100)]
        with watched(server.url):
            closed = _read_until_closed(silent, 60, until=100 - 32)
        still_open = 100 - len(closed)
        assert still_open <= 32, still_open
        assert all(data == b"" for data, _ in closed.values())  # closed without a word
        # The oldest went first.
        assert set(closed) >= set(silent[:60]), "younger connections were closed first"
    finally:
        server.stop()


def test_a_connection_with_a_request_in_flight_is_never_the_one_closed(engine):
    server = GuardedServer(engine, ConnectionLimits(max_connections=4))
    body = {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            silent = [_connect(server.port) for _ in range(20)]  # each closes an idle one
            events = [line for line in lines if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and len(events) == 200, events[-3:]
        assert len(_read_until_closed(silent, 60, until=20 - 3)) >= 20 - 3
    finally:
        server.stop()


def test_when_every_connection_has_a_request_in_flight_a_new_one_gets_a_503(engine):
    server = GuardedServer(engine, ConnectionLimits(body_timeout_s=2.0, max_connections=4))
    try:
        busy = [_connect(server.port) for _ in range(4)]
        for s in busy:  # each a request whose body is on its way
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 50\r\n\r\n{")
        state = server.server.server_state

        def all_owe_bodies() -> bool:
            connections = list(state.connections)
            return len(connections) == 4 and all(c.owed == "body" for c in connections)

        wait_for(all_owe_bodies, 30, "the server to read the four requests' headers")
        refused = httpx.get(server.url + "/health", timeout=60)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
        assert "4 connections open (--max-connections)" in refused.json()["error"]["message"]
        # Once the bodies' deadline has closed them, requests are served again.
        assert len(_read_until_closed(busy, 30)) == 4
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
    finally:
        server.stop()


def test_accepts_failing_for_lack_of_descriptors_log_a_line_not_a_traceback_each(monkeypatch):
    monkeypatch.setattr(connections._ACCEPT_ERRORS, "throttle", connections._Throttle())
    connections.quiet_accept_errors()
    logged = _ListHandler()
    logging.getLogger("asyncio").addHandler(logged)
    loop = asyncio.new_event_loop()
    try:
        for _ in range(1000):  # what asyncio's accept loop reports, a backlog's worth a turn
            error = OSError(errno.EMFILE, "Too many open files")
            message = "socket.accept() out of system resource"
            loop.call_exception_handler({"message": message, "exception": error})
        loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
        logging.getLogger("asyncio").removeHandler(logged)
    [accept, other] = logged.records
    assert "cannot accept connections: [Errno 24] Too many open files" in accept.getMessage()
    assert accept.exc_info is None
    assert other.getMessage() == "something else"


# ---- braid serve as users start it, under the common limit of 1,024 descriptors ---------------


@pytest.fixture(scope="module")
def served(tiny_model_path, tmp_path_factory):
    """`braid serve` as it starts by default (the header deadline 30 s, the Host check of a
    loopback bind), but for a 2 s body deadline; its output in a file, and 1,024 descriptors
    (soft and hard: it cannot raise them)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200  # 1,030 sockets, and this process's own
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the test opens 1,030 sockets; the descriptor limit is {hard}")
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("served") / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            ["sh", "-c", 'ulimit -n 1024 && exec "$@"', "sh"]  # soft and hard
            + [sys.executable, "-m", "braid.runtime.cli", "serve", "--model", str(tiny_model_path)]
            + ["--port", str(port), "--device", "cpu", "--dtype", "float32"]
            + ["--max-kv-tokens", "2048", "--body-timeout-s", "2"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return httpx.get(url + "/health").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(healthy, 120, "braid serve to start")
        yield port, url, log
    finally:
        process.kill()
        process.wait()


def test_more_silent_sockets_than_descriptors_leave_health_answering(served):
    port, url, log = served
    size = log.stat().st_size
    assert "limit (ulimit -n) is 1024: at most 512 connections open" in log.read_text()
    sockets = [_connect(port) for _ in range(1030)]
    with watched(url):
        # The server closes the longest idle to stay under its descriptor limit.
        closed = _read_until_closed(sockets, 60, until=1030 - 512)
    assert len(closed) >= 1030 - 512
    # A line at most, not a traceback per failed accept (a flood of 145 MB in 30 s seen).
    written = log.read_text()[size:]
    assert len(written) < 5_000, written[:2000]
    assert "Traceback" not in written, written[:2000]


def test_braid_serve_takes_the_deadline_flags(served):
    port, url, _ = served
    slow = _connect(port)
    slow.sendall(b"POST /generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 99\r\n\r\n")
    with watched(url):
        [(data, _)] = _read_until_closed([slow], 30, {slow: b"{" * 99}).values()
    assert b"408" in data and b"body did not arrive within 2 s (--body-timeout-s)" in data, data


def test_braid_serve_on_loopback_answers_loopback_names_only(served):
    port, url, _ = served
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        reply = httpx.post(url + "/v1/completions", json=COMPLETION, headers={"Host": host})
        assert reply.status_code == 200, (host, reply.text)
    # A page whose name was rebound to 127.0.0.1 sends its own name.
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        reply = httpx.post(url + "/v1/completions", json=COMPLETION, headers={"Host": host})
        assert reply.status_code == 403, (host, reply.text)
        assert "--allowed-hosts" in reply.json()["error"]["message"]
    reply = httpx.get(url + "/metrics", headers={"Host": "evil.example"})
    assert reply.status_code == 403


# ---- requests a web page could send -----------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(engine):
    server = LiveServer(
        engine,
        api_key="secret",
        allowed_hosts=guards.allowed_hosts("127.0.0.1", None),
        allowed_origins=guards.allowed_origins("http://app.example, http://localhost:3000"),
    )
    yield server
    server.stop()


AUTH = {"Authorization": "Bearer secret"}


def _post(server: LiveServer, headers: dict, content: bytes = b'{"prompt": "Hi", "max_tokens": 1}'):
    return httpx.post(
        server.url + "/v1/completions", content=content, headers=AUTH | headers, timeout=30
    )


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "application/xml"],
)  # fmt: skip
def test_a_body_a_page_could_send_without_a_preflight_is_a_415(guarded, content_type):
    reply = _post(guarded, {"Content-Type": content_type})
    assert reply.status_code == 415, reply.text
    assert "Content-Type: application/json" in reply.json()["error"]["message"]
    assert _post(guarded, {"Content-Type": "application/json"}).status_code == 200


def test_a_json_body_is_served_with_or_without_its_content_type(guarded, engine):
    assert _post(guarded, {"Content-Type": "application/json; charset=utf-8"}).status_code == 200
    assert _post(guarded, {}).status_code == 200  # what requests and httpx send raw bytes with
    # A body-less POST needs none (SGLang's /flush_cache).
    wait_idle(engine)
    assert httpx.post(guarded.url + "/flush_cache", headers=AUTH).status_code == 200


def test_an_origin_not_allowed_is_refused_and_an_allowed_one_gets_cors(guarded):
    json_ = {"Content-Type": "application/json"}
    for origin in ("http://evil.example", "null", "http://app.example:8080"):
        reply = _post(guarded, json_ | {"Origin": origin})
        assert reply.status_code == 403, reply.text
        assert "--allowed-origins" in reply.json()["error"]["message"]
    reply = _post(guarded, json_ | {"Origin": "http://app.example"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["access-control-allow-origin"] == "http://app.example"
    # The preflight carries no API key: answered before the key is asked for.
    preflight = httpx.options(
        guarded.url + "/v1/completions",
        headers={
            "Origin": "http://localhost:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    evil = httpx.options(
        guarded.url + "/v1/completions",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert evil.status_code == 403


def test_the_official_clients_pass_the_guards(guarded):
    import anthropic
    import openai

    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key="secret", max_retries=0)
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert chat.choices[0].message.content is not None
    messages = anthropic.Anthropic(base_url=guarded.url, api_key="secret", max_retries=0)
    reply = messages.messages.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply.content


def test_allowed_hosts_follow_the_bind_address_and_the_flag():
    assert guards.allowed_hosts("127.0.0.1", None) == guards.LOOPBACK_NAMES
    assert guards.allowed_hosts("::1", None) == guards.LOOPBACK_NAMES
    assert guards.allowed_hosts("127.0.0.5", None) == guards.LOOPBACK_NAMES | {"127.0.0.5"}
    assert guards.allowed_hosts("0.0.0.0", None) is None  # any: its names are not known
    assert guards.allowed_hosts("0.0.0.0", "llm.lan, 10.0.0.2") == {"llm.lan", "10.0.0.2"}
    assert guards.allowed_hosts("127.0.0.1", "*") is None
    assert guards.allowed_origins(None) == frozenset()
    assert guards.allowed_origins("http://A.example/, *") == {"http://a.example", "*"}
    with pytest.raises(ValueError, match="ConnectionLimits.header_timeout_s must be > 0"):
        ConnectionLimits(header_timeout_s=0)


# ---- the --dp front ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def front(engine, tiny_model_path):
    """A front (and SGLang's router) before one replica: a server in this process, whose
    engine the tests read."""
    replica = LiveServer(engine)
    flags = ["--dp", "0", "--worker-url", replica.url, "--served-model-name", "tiny"]
    flags += ["--max-request-bytes", "100000"]
    try:
        with ServeProcess(tiny_model_path, *flags, "--header-timeout-s", "1") as front:
            yield front
    finally:
        replica.stop()


def _front_port(front: ServeProcess) -> int:
    return int(front.url.rsplit(":", 1)[1])


def test_the_front_refuses_a_body_over_the_limit_before_reading_it(front):
    port = _front_port(front)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    declared = _connect(port)  # says 1 GB is coming, sends none of it
    declared.sendall(head + b"Content-Length: 1000000000\r\n\r\n")
    chunked = _connect(port)  # sends 110 kB of a body without end: just past the limit
    chunked.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
    with contextlib.suppress(OSError):  # the front may answer and close before the last
        for _ in range(11):
            chunked.sendall(b"2710\r\n" + b"a" * 10_000 + b"\r\n")
    with watched(front.url):
        closed = _read_until_closed([declared, chunked], 10)
    assert len(closed) == 2, "the front waited for the rest of a body over its limit"
    for data, _ in closed.values():
        assert data.startswith(b"HTTP/1.1 413"), data[:200]


@pytest.mark.parametrize(
    "fields",
    [{}, {"stop_regex": "QQQ[0-9]"}],
    ids=["through the router", "straight to the replica"],  # the router would lose stop_regex
)
def test_a_client_that_leaves_the_front_aborts_its_request_on_the_replica(front, engine, fields):
    wait_idle(engine)
    aborted = engine.stats()["requests_aborted"]
    body = {
        "text": "Count: one two three",
        "sampling_params": {"max_new_tokens": 480, "ignore_eos": True, **fields},
    }
    content = json.dumps(body).encode()
    client = _connect(_front_port(front))
    client.sendall(
        b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(content)}\r\n\r\n".encode()
        + content
    )
    wait_for(lambda: engine.stats()["running_requests"] == 1, 30, "the request to run")
    decoded = engine.stats()["decode_tokens"]
    client.close()  # the client leaves
    wait_idle(engine, timeout=30)
    assert engine.stats()["requests_aborted"] == aborted + 1
    assert engine.stats()["decode_tokens"] - decoded < 470  # it did not decode on to the end


def test_the_front_has_the_deadlines_and_the_host_check(front):
    slow = _connect(_front_port(front))
    with watched(front.url):
        [(data, _)] = _read_until_closed([slow], 30, {slow: SLOW_HEADERS}).values()
    assert b"headers did not arrive within 1 s (--header-timeout-s)" in data, data
    reply = httpx.get(front.url + "/health", headers={"Host": "evil.example"})
    assert reply.status_code == 403, reply.text


def test_serve_help_names_the_connection_flags(capsys):
    from braid.runtime.cli.main import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--header-timeout-s", "--body-timeout-s", "--keep-alive-timeout-s"):
        assert flag in text
    assert "--max-connections" in text and "(default: 2048)" in text
    assert "--allowed-hosts" in text and "--allowed-origins" in text


def test_a_client_that_never_reads_gives_up_its_places(engine):
    """Streams whose client never reads (its socket's buffers full) would hold their places
    for ever: past --write-timeout-s the connection is dropped and the places are freed, so
    other clients are served while the attacker still holds its sockets open."""
    limits = ConnectionLimits(write_timeout_s=2.0)
    server = GuardedServer(engine, limits)
    svc = server.server.config.app.state.service
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 400,
        "n": 16,
        "ignore_eos": True,
        "logprobs": 20,  # megabytes of events: past what the sockets' buffers hold
        "stream": True,
    }
    raw = json.dumps(body).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json"
        f"\r\ncontent-length: {len(raw)}\r\n\r\n"
    ).encode() + raw
    try:
        for _ in range(2):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and reads nothing
            s.connect(("127.0.0.1", server.port))
            s.sendall(request)
            _opened.append(s)
        wait_for(lambda: svc.num_active == 32, 30, "both streams to be admitted")
        # The engine runs them to their end; their places go once the deadline drops them.
        wait_for(lambda: svc.num_active == 0, 180, "the unread streams' places")
        served = httpx.post(server.url + "/v1/completions", json=COMPLETION, timeout=30)
        assert served.status_code == 200, served.text
    finally:
        server.stop()
