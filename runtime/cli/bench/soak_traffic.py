"""The traffic of `braid bench soak`: the kinds of request a long-running server meets, each
sent and judged by what came back.

Outcomes: "complete" (a whole answer of the right shape; a constrained one that finished
matches its constraint), "left" and "aborted" (the client went away on purpose: mid-stream,
or before its plain answer came), "refused" (a 503 at the queue limit), "rejected" (a
400 for a request built to break a limit) and "held" (a hostile client's attack, answered
as it must be). Anything else (another status, an error event, a stream without its end,
an answer of the wrong shape, a timeout, an attack that got through) is a lost request.

The hostile clients (HOSTILE, a share of the mix): one that never reads its big stream
(its socket's buffers fill; the server must drop it past its write deadline), one that
leaves a slow compile (the compile must not hold up the constrained requests after it),
one sending a body past the server's limit (a 413), and, given a second tenant's key, one
probing the first tenant's stored response, the cache flush and the dashboard.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import socket
import time
from dataclasses import dataclass

import httpx

CLEAN = frozenset({"complete", "left", "aborted", "refused", "rejected", "held"})
# Kind -> how many of each cycle of the mix (cycles shuffled, so that every kind comes within
# a few dozen requests). Constrained kinds use a new schema or regex each time, so the
# grammar cache keeps compiling and evicting; every third stream leaves early.
KINDS = {
    "plain": 3,
    "stream": 4,
    "json": 2,
    "regex": 2,
    "stop_regex": 1,
    "n": 1,
    "logprobs": 1,
    "chat_logprobs": 1,
    "abort": 1,
    "bad": 1,
    "never_reads": 1,
    "abandoned_compile": 1,
    "oversized": 1,
    "tenant_probe": 1,
}
HOSTILE = frozenset({"never_reads", "abandoned_compile", "oversized", "tenant_probe"})
# How long the client that never reads holds its socket: past the soak server's write
# deadline (5 s), so that the server is the one to drop it.
_UNREAD_HOLD_S = 8.0
# A body past the server's default limit (16 MiB).
_OVERSIZED_BYTES = 17 * 1024 * 1024
_WORDS = "the a model cache token prefix batch answer question how why when kernel queue".split()
_TIMEOUT_S = 300.0  # an answer slower than this counts as lost


@dataclass(frozen=True)
class Result:
    kind: str
    outcome: str
    latency_s: float | None  # arrival -> answer, of a complete one
    end: float  # time.monotonic() when it ended


class Traffic:
    """Sends requests of the mix to one server (`http` has its base URL)."""

    def __init__(self, http: httpx.AsyncClient, seed: int, other_key: str | None = None) -> None:
        """`http` carries the first tenant's key, if the server takes keys; `other_key`: a
        second tenant's, for the tenant probe (without it the probe is left out)."""
        self.http = http
        self.rng = random.Random(seed)
        self.serial = itertools.count()  # makes each constraint distinct
        self.streams = itertools.count()
        self.cycle: list[str] = []
        self.other_key = other_key
        self.kinds = {k: n for k, n in KINDS.items() if k != "tenant_probe" or other_key}

    async def one(self, kind: str | None = None) -> Result:
        """A request of `kind` (default: the mix's next), judged."""
        if kind is None:
            if not self.cycle:
                self.cycle = [k for k, count in self.kinds.items() for _ in range(count)]
                self.rng.shuffle(self.cycle)
            kind = self.cycle.pop()
        start = time.monotonic()
        try:
            outcome = await asyncio.wait_for(getattr(self, "_" + kind)(), _TIMEOUT_S)
        except TimeoutError:
            outcome = "timed out"
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
            outcome = f"{type(e).__name__}: {e}"[:120]
        end = time.monotonic()
        return Result(kind, outcome, end - start if outcome == "complete" else None, end)

    # ---- the kinds ----------------------------------------------------------------------

    async def _plain(self, max_tokens: int | None = None) -> str:
        tokens = max_tokens or self.rng.randint(4, 24)
        body = self._completion(tokens)
        failed, obj = await self._post("/v1/completions", body)
        if failed:
            return failed
        return _complete(len(obj["choices"]) == 1 and obj["usage"]["completion_tokens"] == tokens)

    async def _abort(self) -> str:
        """A plain request the client gives up on mid-way (its connection closes, which
        must abort it on the server)."""
        try:
            return await asyncio.wait_for(self._plain(64), self.rng.uniform(0.05, 0.5))
        except TimeoutError:
            return "aborted"

    async def _stream(self) -> str:
        tokens = self.rng.randint(4, 24)
        leave_after = self.rng.randint(1, 3) if next(self.streams) % 3 == 0 else None
        body = self._completion(tokens) | {"stream": True}
        body["stream_options"] = {"include_usage": True}
        events, usage = 0, None
        async with self.http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return _status(r)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return _complete(usage is not None and usage["completion_tokens"] == tokens)
                obj = json.loads(data)
                if "error" in obj:
                    return f"error event: {obj['error']['message']}"[:120]
                if obj.get("usage"):
                    usage = obj["usage"]
                else:
                    events += 1
                if leave_after is not None and events >= leave_after:
                    return "left"
        return "stream ended without [DONE]"

    async def _json(self) -> str:
        i = next(self.serial)
        names = [f"id{i}", "tag", "ok"]
        schema = {
            "type": "object",
            "properties": {
                names[0]: {"type": "integer", "minimum": 0, "maximum": 1000 + i},
                names[1]: {"enum": ["red", "green", f"blue{i % 7}"]},
                names[2]: {"type": "boolean"},
            },
            "required": names,
            "additionalProperties": False,
        }
        body = {
            "messages": [{"role": "user", "content": self._prompt()}],
            "max_tokens": 48,
            "temperature": 0.8,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        }
        failed, obj = await self._post("/v1/chat/completions", body)
        if failed:
            return failed
        choice = obj["choices"][0]
        if choice["finish_reason"] != "stop":
            return "complete"  # cut by max_tokens: a prefix of a document
        document = json.loads(choice["message"]["content"])
        return _complete(isinstance(document, dict) and list(document) == names)

    async def _regex(self) -> str:
        i = next(self.serial)
        pattern = rf"(yes|no|id{i}): [a-z]{{1,8}}( [a-z]{{1,8}}){{0,{i % 4}}}\."
        body = self._completion(32, ignore_eos=False) | {"regex": pattern}
        failed, obj = await self._post("/v1/completions", body)
        if failed:
            return failed
        choice = obj["choices"][0]
        matched = choice["finish_reason"] != "stop" or re.fullmatch(pattern, choice["text"])
        return _complete(bool(matched))

    async def _stop_regex(self) -> str:
        i = next(self.serial)
        body = self._completion(24, ignore_eos=False) | {"stop_regex": [rf"q{i}z", r"\d{3}"]}
        failed, obj = await self._post("/v1/completions", body)
        if failed:
            return failed
        return _complete(obj["choices"][0]["finish_reason"] in ("stop", "length"))

    async def _n(self) -> str:
        n, tokens = self.rng.randint(2, 4), self.rng.randint(4, 12)
        failed, obj = await self._post("/v1/completions", self._completion(tokens) | {"n": n})
        if failed:
            return failed
        indexes = sorted(c["index"] for c in obj["choices"])
        return _complete(
            indexes == list(range(n)) and obj["usage"]["completion_tokens"] == n * tokens
        )

    async def _logprobs(self) -> str:
        tokens = self.rng.randint(4, 12)
        body = self._completion(tokens) | {"logprobs": 2}
        failed, obj = await self._post("/v1/completions", body)
        if failed:
            return failed
        listing = obj["choices"][0]["logprobs"]
        # top_logprobs maps token text to logprob (the legacy format): two of the top tokens
        # with the same text (byte pieces both shown as U+FFFD) leave one entry, not two.
        ok = len(listing["token_logprobs"]) == tokens and all(
            1 <= len(t) <= 2 for t in listing["top_logprobs"]
        )
        return _complete(ok)

    async def _chat_logprobs(self) -> str:
        tokens = self.rng.randint(4, 12)
        body = {
            "messages": [{"role": "user", "content": self._prompt()}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 2,
        }
        failed, obj = await self._post("/v1/chat/completions", body)
        if failed:
            return failed
        content = obj["choices"][0]["logprobs"]["content"]
        return _complete(len(content) == obj["usage"]["completion_tokens"] == tokens)

    async def _bad(self) -> str:
        """A request past a limit: it must be a 400, and cost the server nothing else."""
        deep = {}
        for _ in range(500):
            deep = {"type": "array", "items": deep}
        breaks = [
            {"max_tokens": 10**12},
            {"max_tokens": 2**70},
            {"n": 10**6},
            {"stop": ["stop"] * 100},
            {"json_schema": deep},
            {"top_k": 2**70},
        ]
        body = self._completion(4) | self.rng.choice(breaks)
        failed, _ = await self._post("/v1/completions", body)
        return "rejected" if failed == "http 400" else failed or "accepted past a limit"

    # ---- the hostile clients ------------------------------------------------------------

    async def _never_reads(self) -> str:
        """A stream of 8 samples with 20 logprobs a token (over a megabyte), on a socket with
        a small receive buffer that is never read, held past the server's write deadline."""
        body = self._completion(96) | {"stream": True, "n": 8, "logprobs": 20}
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        url = self.http.base_url
        await asyncio.get_running_loop().sock_connect(sock, (url.host, url.port))
        _, writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(_request_bytes("/v1/completions", body, url, self.http.headers))
            await writer.drain()
            await asyncio.sleep(_UNREAD_HOLD_S)
        finally:
            writer.close()
        return "held"

    async def _abandoned_compile(self) -> str:
        """A stop regex that takes many seconds to compile, given up after half a second."""
        body = self._completion(4) | {"stop_regex": f"a{{{20000 + next(self.serial)}}}"}
        try:
            r = await self.http.post("/v1/completions", json=body, timeout=0.5)
        except httpx.TimeoutException:
            return "held"
        if r.status_code == 503:  # the queue was full (a burst): refused before compiling
            return "refused"
        return f"slow compile answered at once: http {r.status_code}"

    async def _oversized(self) -> str:
        content = b'{"prompt": "' + b"x" * _OVERSIZED_BYTES + b'"}'
        headers = {"content-type": "application/json"}
        r = await self.http.post("/v1/completions", content=content, headers=headers)
        return "held" if r.status_code == 413 else f"oversized body: http {r.status_code}"

    async def _tenant_probe(self) -> str:
        """The first tenant stores a response; the second may not read it, continue it,
        delete it, flush the cache or see the first's requests on the dashboard."""
        body = {"input": self._prompt(), "max_output_tokens": 4, "store": True}
        failed, stored = await self._post("/v1/responses", body)
        if failed:
            return failed
        other = {"authorization": f"Bearer {self.other_key}"}
        path = f"/v1/responses/{stored['id']}"
        continued = {"input": "and?", "previous_response_id": stored["id"], "max_output_tokens": 1}
        answers = [
            ("get", await self.http.get(path, headers=other), 404),
            ("continue", await self.http.post("/v1/responses", json=continued, headers=other), 400),
            ("delete", await self.http.delete(path, headers=other), 404),
            ("flush", await self.http.post("/flush_cache", headers=other), 403),
        ]
        for what, r, expected in answers:
            if r.status_code != expected:
                return f"tenant probe: {what} got http {r.status_code}"
        board = await self.http.get("/dashboard/data", headers=other)
        if board.status_code != 200 or board.json()["requests"]:
            return "tenant probe: the dashboard listed requests"
        if (await self.http.get(path)).status_code != 200:
            return "tenant probe: the owner lost its response"
        return "held"

    # ---- helpers ------------------------------------------------------------------------

    def _prompt(self) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randint(10, 60)))

    def _completion(self, max_tokens: int, ignore_eos: bool = True) -> dict:
        return {
            "prompt": self._prompt(),
            "max_tokens": max_tokens,
            "ignore_eos": ignore_eos,
            "temperature": 0.8,
        }

    async def _post(self, path: str, body: dict) -> tuple[str | None, dict]:
        """(None, the answer) for a 200, else (its outcome, {})."""
        r = await self.http.post(path, json=body)
        if r.status_code == 200:
            return None, r.json()
        return _status(r), {}


def _request_bytes(path: str, body: dict, url: httpx.URL, headers: httpx.Headers) -> bytes:
    """An HTTP/1.1 POST of `body` as JSON, with the client's authorization header."""
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", f"Host: {url.host}:{url.port}"]
    head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    if "authorization" in headers:
        head.append(f"Authorization: {headers['authorization']}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


def _status(r: httpx.Response) -> str:
    if r.status_code == 503:
        return "refused"
    return f"http {r.status_code}"


def _complete(ok: bool) -> str:
    return "complete" if ok else "wrong answer"
