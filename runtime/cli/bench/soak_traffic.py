"""The traffic of `braid bench soak`: the kinds of request a long-running server meets, each
sent and judged by what came back.

Outcomes: "complete" (a whole answer of the right shape; a constrained one that finished
matches its constraint), "left" and "aborted" (the client went away on purpose: mid-stream,
or before its plain answer came), "refused" (a 503 at the queue limit) and "rejected" (a
400 for a request built to break a limit). Anything else (another status, an error event,
a stream without its end, an answer of the wrong shape, a timeout) is a lost request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import time
from dataclasses import dataclass

import httpx

CLEAN = frozenset({"complete", "left", "aborted", "refused", "rejected"})
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
}
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

    def __init__(self, http: httpx.AsyncClient, seed: int) -> None:
        self.http = http
        self.rng = random.Random(seed)
        self.serial = itertools.count()  # makes each constraint distinct
        self.streams = itertools.count()
        self.cycle: list[str] = []

    async def one(self, kind: str | None = None) -> Result:
        """A request of `kind` (default: the mix's next), judged."""
        if kind is None:
            if not self.cycle:
                self.cycle = [k for k, count in KINDS.items() for _ in range(count)]
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


def _status(r: httpx.Response) -> str:
    if r.status_code == 503:
        return "refused"
    return f"http {r.status_code}"


def _complete(ok: bool) -> str:
    return "complete" if ok else "wrong answer"
