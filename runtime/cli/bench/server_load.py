"""`braid bench serve`: the HTTP server under streaming load, against a `braid serve` it starts.

The sweep reports throughput and TTFT/TPOT percentiles at each concurrency. (Long runs of
mixed traffic are `braid bench soak`.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import httpx

from braid.runtime.cli.bench.common import ServeProcess, add_workload, machine, write_result
from braid.runtime.stats import percentile

_WORDS = "the a model cache token prefix batch answer question how why when kernel queue".split()


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = add_workload(workloads, "serve", "HTTP streaming load: a concurrency sweep", bench_serve)
    p.add_argument("--max-kv-tokens", type=int, default=32768, help="KV pool size")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=2, help="requests per client per level")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")


def bench_serve(args: argparse.Namespace) -> int:
    flags = ["--dtype", args.dtype, "--max-kv-tokens", str(args.max_kv_tokens)]
    with ServeProcess(args.model, flags) as server:
        result = asyncio.run(_sweep(server, args))
    result |= {"machine": machine(), "model": args.model or "default"}
    write_result(result, args.json)
    return 0


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


async def _sweep(server: ServeProcess, args: argparse.Namespace) -> dict:
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
