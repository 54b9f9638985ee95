"""`braid bench serve`: the HTTP server under streaming load, against a `braid serve` it starts.

The sweep reports throughput and TTFT/TPOT percentiles at each concurrency. `--soak SECONDS`
instead runs mixed traffic (streaming, non-streaming, constrained, clients that leave early)
and checks afterwards that nothing was lost and the server is back to idle: no request
running, every KV slot free or cached, resident memory where it was after the warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from braid.runtime.bench.common import machine, rss_mb, write_result
from braid.runtime.stats import percentile

_WORDS = "the a model cache token prefix batch answer question how why when kernel queue".split()
_KINDS = ("stream", "plain", "regex", "json", "leave")
_WEIGHTS = (4, 2, 1, 1, 2)
# Resident memory may settle this much above its post-warm-up value (allocator noise).
_RSS_TOLERANCE = 0.10


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = workloads.add_parser(
        "serve", help="HTTP streaming load: concurrency sweep, or a soak run with --soak"
    )
    p.add_argument("--model")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--max-kv-tokens",
        type=int,
        help="KV pool size (default: 32768; 4096 for --soak, so its warm-up fills the pool)",
    )
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=2, help="requests per client per level")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--soak", type=float, metavar="SECONDS", help="run the soak instead")
    p.add_argument("--soak-concurrency", type=int, default=16)
    p.add_argument("--json", type=Path)
    p.set_defaults(run=bench_serve)


def bench_serve(args: argparse.Namespace) -> int:
    with _Server(args) as server:
        if args.soak:
            result = asyncio.run(_soak(server, args))
            ok = result["ok"]
        else:
            result = asyncio.run(_sweep(server, args))
            ok = True
    result |= {"machine": machine(), "model": args.model or "default"}
    default = Path(f"bench-results/serve{'-soak' if args.soak else ''}.json")
    write_result(result, args.json or default)
    return 0 if ok else 1


class _Server:
    """`braid serve` in a subprocess on a free loopback port."""

    def __init__(self, args: argparse.Namespace) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "braid.runtime.cli", "serve"]
        self.command += ["--port", str(self.port)]
        kv = args.max_kv_tokens or (4096 if args.soak else 32768)
        self.command += ["--dtype", args.dtype, "--max-kv-tokens", str(kv)]
        if args.model:
            self.command += ["--model", args.model]

    def __enter__(self) -> _Server:
        self.process = subprocess.Popen(self.command)
        deadline = time.monotonic() + 600
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"braid serve exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("braid serve did not come up in 10 minutes")
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.25)

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(60)

    def rss_mb(self) -> float:
        return rss_mb(self.process.pid)


def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 120)))


async def _stream(http: httpx.AsyncClient, body: dict, leave_after: int | None = None) -> dict:
    """One streamed completion: its TTFT, TPOT and token count, or that the client left."""
    start = time.perf_counter()
    first = None
    events = 0
    usage = None
    async with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"outcome": f"http {r.status_code}"}
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            obj = json.loads(line[5:])
            if "error" in obj:
                return {"outcome": "error"}
            if obj.get("usage"):
                usage = obj["usage"]
            elif obj["choices"][0]["text"]:
                first = first or time.perf_counter()
                events += 1
                if leave_after is not None and events >= leave_after:
                    return {"outcome": "left"}
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else 0
    if first is None or tokens != body["max_tokens"]:
        return {"outcome": "incomplete"}
    return {
        "outcome": "complete",
        "ttft": first - start,
        "tpot": (end - first) / max(1, tokens - 1),
        "tokens": tokens,
    }


def _client(url: str, n: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=n + 4)
    return httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(600))


async def _sweep(server: _Server, args: argparse.Namespace) -> dict:
    levels = [int(c) for c in args.concurrency.split(",")]
    rng = random.Random(0)
    rows = []
    async with _client(server.url, max(levels)) as http:
        warm = {"prompt": "warm up", "max_tokens": 4, "ignore_eos": True, "stream": True}
        await _stream(http, warm | {"stream_options": {"include_usage": True}})
        for c in levels:
            bodies = [
                {
                    "prompt": _prompt(rng),
                    "max_tokens": args.tokens,
                    "ignore_eos": True,
                    "temperature": 0.8,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                for _ in range(c * args.requests)
            ]
            gate = asyncio.Semaphore(c)

            async def one(body: dict, gate: asyncio.Semaphore = gate) -> dict:
                async with gate:
                    return await _stream(http, body)

            start = time.perf_counter()
            results = await asyncio.gather(*(one(b) for b in bodies))
            seconds = time.perf_counter() - start
            done = [r for r in results if r["outcome"] == "complete"]
            ttft, tpot = sorted(r["ttft"] for r in done), sorted(r["tpot"] for r in done)
            rows.append(
                {
                    "concurrency": c,
                    "requests": len(bodies),
                    "complete": len(done),
                    "output_tok_s": sum(r["tokens"] for r in done) / seconds,
                    "ttft_p50_s": percentile(ttft, 50),
                    "ttft_p99_s": percentile(ttft, 99),
                    "tpot_p50_s": percentile(tpot, 50),
                    "tpot_p99_s": percentile(tpot, 99),
                }
            )
    print(f"serve: streaming /v1/completions, prompts 20-120 words, {args.tokens} tokens each")
    print(f"{'clients':>8}{'reqs':>6}{'tok/s':>9}{'TTFT p50/p99 s':>18}{'TPOT p50/p99 ms':>18}")
    for r in rows:
        print(
            f"{r['concurrency']:>8}{r['complete']:>6}{r['output_tok_s']:>9.1f}"
            f"{r['ttft_p50_s']:>9.2f}/{r['ttft_p99_s']:<8.2f}"
            f"{r['tpot_p50_s'] * 1e3:>9.1f}/{r['tpot_p99_s'] * 1e3:<8.1f}"
        )
    return {"workload": "serve", "tokens": args.tokens, "levels": rows}


async def _soak(server: _Server, args: argparse.Namespace) -> dict:
    """Mixed traffic for args.soak seconds, then the idle checks."""
    rng = random.Random(0)
    counts: dict[str, int] = {}
    async with _client(server.url, args.soak_concurrency) as http:

        async def traffic(seconds: float, counts: dict[str, int]) -> None:
            deadline = time.monotonic() + seconds

            async def worker() -> None:
                while time.monotonic() < deadline:
                    kind = rng.choices(_KINDS, _WEIGHTS)[0]
                    outcome = await _soak_request(http, kind, rng)
                    counts[outcome] = counts.get(outcome, 0) + 1

            await asyncio.gather(*(worker() for _ in range(args.soak_concurrency)))

        # The same traffic first, until the prefix cache has filled the KV pool (evictions
        # begin) or for half the soak: the pool's pages are first touched then, so idle
        # memory after it is the baseline that must hold.
        warm_deadline = time.monotonic() + args.soak / 2
        while time.monotonic() < warm_deadline:
            await traffic(5.0, {})
            if (await _wait_idle(http))["evicted_tokens"] > 0:
                break
        await http.post("/flush_cache")
        baseline_rss = server.rss_mb()
        await traffic(args.soak, counts)
        stats = await _wait_idle(http)
        await http.post("/flush_cache")
        final_rss = server.rss_mb()
    lost = sum(n for outcome, n in counts.items() if outcome not in ("complete", "left"))
    kv_idle = stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]
    rss_ok = final_rss <= baseline_rss * (1 + _RSS_TOLERANCE)
    ok = lost == 0 and kv_idle and rss_ok
    print(f"soak: {args.soak:.0f} s, {args.soak_concurrency} clients, outcomes {counts}")
    print(
        f"idle after: running {stats['running_requests']}, waiting {stats['waiting_requests']}, "
        f"KV free+cached == total: {kv_idle}; RSS {baseline_rss:.0f} -> {final_rss:.0f} MB; "
        f"lost requests: {lost} -> {'OK' if ok else 'FAILED'}"
    )
    return {
        "workload": "serve-soak",
        "seconds": args.soak,
        "clients": args.soak_concurrency,
        "outcomes": counts,
        "lost": lost,
        "kv_idle": kv_idle,
        "rss_mb_baseline": baseline_rss,
        "rss_mb_final": final_rss,
        "ok": ok,
    }


async def _soak_request(http: httpx.AsyncClient, kind: str, rng: random.Random) -> str:
    tokens = rng.randint(8, 48)
    body = {"prompt": _prompt(rng), "max_tokens": tokens, "ignore_eos": True, "temperature": 0.8}
    if kind in ("stream", "leave"):
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        leave = rng.randint(1, max(1, tokens // 2)) if kind == "leave" else None
        return (await _stream(http, body, leave))["outcome"]
    if kind == "regex":
        body |= {"regex": r"[a-z]{3,8}( [a-z]{3,8}){0,5}\.", "ignore_eos": False}
    elif kind == "json":
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        body |= {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
        body |= {"ignore_eos": False}
    if kind in ("regex", "json"):  # a chat request, so response_format applies
        body = {k: v for k, v in body.items() if k != "prompt"}
        body["messages"] = [{"role": "user", "content": _prompt(rng)}]
        r = await http.post("/v1/chat/completions", json=body)
        return "complete" if r.status_code == 200 else f"http {r.status_code}"
    r = await http.post("/v1/completions", json=body)
    if r.status_code != 200:
        return f"http {r.status_code}"
    done = r.json()["usage"]["completion_tokens"] == tokens
    return "complete" if done else "incomplete"


async def _wait_idle(http: httpx.AsyncClient, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = (await http.get("/server_info")).json()["stats"]
        if stats["running_requests"] == stats["waiting_requests"] == 0:
            return stats
        if time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.05)
