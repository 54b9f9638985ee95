"""/dashboard: a live page of the engine's own figures, and /dashboard/data, the JSON it polls.

The page (dashboard.html, self-contained: inline CSS and JS, nothing fetched but the data)
charts running and queued requests, tokens/s, KV use and the prefix-cache hit rate, TTFT and
TPOT percentiles over the last minutes and grammar-cache memory, and lists the last requests
with their timelines (and their tokens, for requests that asked for a trace). Samples are
taken when the data is read, at most one a second, and kept for `HISTORY_S`.

Both routes need the API key like every route; a browser cannot send a header when it opens
a page, so these two also take it as `?key=` (the page passes it on to its data requests).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from braid.runtime.engine.engine import Engine
from braid.runtime.stats import percentile

PATHS = frozenset({"/dashboard", "/dashboard/data"})
HISTORY_S = 600  # how far back the charts reach
WINDOW_S = 300  # the latency percentiles cover the requests that ended this recently
KEPT_REQUESTS = 2048  # requests kept for the percentiles (the newest, if more end in the window)
LISTED_REQUESTS = 20  # requests the page lists
_SAMPLE_EVERY_S = 1.0
_COUNTERS = ("prompt_tokens", "cached_tokens", "decode_tokens", "prefill_tokens_computed")


def key_in_query(scope: dict) -> bytes:
    """The `key` query parameter of a GET to the dashboard (b"" for any other request)."""
    if scope.get("method") != "GET" or scope["path"] not in PATHS:
        return b""
    keys = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("key", [""])
    return keys[0].encode("latin-1")


@dataclass
class Dashboard:
    engine: Engine
    # Under --cache-scope key each key is a tenant, and the engine's summaries do not say
    # whose a request was: the list of last requests (their counts and traced text) is
    # left out, and only the whole engine's figures shown.
    lists_requests: bool = True
    samples: deque[dict] = field(default_factory=deque)
    _last: dict | None = None  # the previous sample's counters, for rates

    def __post_init__(self) -> None:
        # The engine keeps a summary of each request that ends only while a dashboard asks
        # (servers sharing an engine share its deque).
        if self.engine.outputs.recent is None:
            self.engine.outputs.recent = deque(maxlen=KEPT_REQUESTS)

    def data(self) -> dict:
        now = time.monotonic()
        if not self.samples or now - self.samples[-1]["t"] >= _SAMPLE_EVERY_S:
            self.samples.append(self._sample(now))
        while now - self.samples[0]["t"] > HISTORY_S:
            self.samples.popleft()
        recent = list(self.engine.outputs.recent)[-LISTED_REQUESTS:] if self.lists_requests else []
        return {
            "now": now,
            "samples": list(self.samples),
            "requests": [self._request(r, now) for r in reversed(recent)],
        }

    def _sample(self, now: float) -> dict:
        s = self.engine.stats()
        counters = {k: s[k] for k in _COUNTERS}
        last, self._last = self._last, {"t": now, **counters}
        elapsed = now - last["t"] if last else 0.0

        def rate(k: str) -> float | None:
            return (counters[k] - last[k]) / elapsed if last and elapsed > 0 else None

        ended = [r for r in list(self.engine.outputs.recent) if now - r["finished"] <= WINDOW_S]
        ttft = sorted(r["first_token"] - r["arrival"] for r in ended if r["first_token"])
        tpot = sorted(_tpot(r) for r in ended if _tpot(r) is not None)
        total = s["kv_slots_total"]
        return {
            "t": now,
            "running": s["running_requests"],
            "queued": s["waiting_requests"],
            "decode_tokens_per_s": rate("decode_tokens"),
            "prefill_tokens_per_s": rate("prefill_tokens_computed"),
            "kv_use": 1 - (s["kv_slots_free"] + s["kv_slots_cached"]) / total,
            "kv_cached": s["kv_slots_cached"] / total,
            "cache_hit": s["cached_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0,
            "grammar_memory_bytes": s["grammar_memory_bytes"],
            "requests_finished": s["requests_finished"],
            **{f"ttft_p{q}_ms": _ms(percentile(ttft, q)) for q in (50, 90, 99)},
            **{f"tpot_p{q}_ms": _ms(percentile(tpot, q)) for q in (50, 90, 99)},
        }

    def _request(self, r: dict, now: float) -> dict:
        out = {k: v for k, v in r.items() if k not in ("trace", "token_ids", "logprobs", "texts")}
        out.update(ago_s=now - r["finished"], ttft_ms=_ms(_since(r["first_token"], r["arrival"])))
        out["tpot_ms"] = _ms(_tpot(r))
        trace = r.get("trace")
        if trace is not None:
            if "texts" not in r:  # decoded once: the engine is done with the summary
                r["texts"] = [self.engine.tokenizer.decode([t]) for t in r["token_ids"]]
            texts = r["texts"]
            out["queued_ms"] = _ms(_since(trace["started"], r["arrival"]))
            out["tokens"] = [
                {"text": text, "forced": forced, "allowed": allowed, "logprob": lp}
                for text, forced, allowed, lp in zip(
                    texts,
                    trace["forced"],
                    trace["allowed"],
                    r["logprobs"] or [None] * len(texts),
                    strict=True,
                )
            ]
        return out


def _tpot(r: dict) -> float | None:
    if r["first_token"] is None or r["completion_tokens"] < 2:
        return None
    return (r["finished"] - r["first_token"]) / (r["completion_tokens"] - 1)


def _since(t: float | None, start: float) -> float | None:
    return None if t is None else t - start


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


async def page(request: Request) -> Response:
    html = resources.files("braid.runtime.server").joinpath("dashboard.html").read_text("utf-8")
    return HTMLResponse(html)


async def data(request: Request) -> Response:
    return JSONResponse(request.app.state.dashboard.data())


ROUTES = [
    Route("/dashboard", page, methods=["GET"]),
    Route("/dashboard/data", data, methods=["GET"]),
]
