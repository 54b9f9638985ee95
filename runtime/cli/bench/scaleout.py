"""`braid bench scaleout`: `braid serve` with more engine replicas, on a few-shot workload
(every prompt one of a few long shared prefixes, then a question), and what braid's front
and SGLang's router cost per request.

The configurations are `braid serve`s of their own on loopback, all started first: one
engine served directly; the same engine behind the front and the router (`--dp 0
--worker-url`); `--dp N` for each N of --replicas. The measurements take turns, --repeats
times, and each configuration keeps its best run, so load from elsewhere on the machine
weighs on all alike. Caches are flushed before each run, after a warm-up. The overhead is
the difference in median latency of sequential one-token requests, sent directly and
through the front in turns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from braid.runtime.cli.bench.common import FEWSHOT_EXAMPLES, machine, write_result
from braid.runtime.cluster.processes import free_port


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = workloads.add_parser("scaleout", help="requests/s with 1..N replicas; router overhead")
    p.add_argument("--model")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--replicas", default="2", help="comma-separated replica counts beyond 1")
    p.add_argument("--prefixes", type=int, default=4, help="distinct few-shot prefixes")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    p.add_argument("--repeats", type=int, default=3, help="runs per configuration (best kept)")
    p.add_argument("--overhead-requests", type=int, default=50)
    p.add_argument("--json", type=Path)
    p.set_defaults(run=bench_scaleout)


def bench_scaleout(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as servers:
        single = servers.enter_context(_Serve(args))
        front = servers.enter_context(_Serve(args, "--dp", "0", "--worker-url", single.url))
        targets = {"1 (braid serve)": single.url, "1 (front + router)": front.url}
        for n in (int(x) for x in args.replicas.split(",")):
            targets[f"{n} (--dp {n})"] = servers.enter_context(_Serve(args, "--dp", str(n))).url
        runs: dict[str, list[dict]] = {label: [] for label in targets}
        for _ in range(args.repeats):
            for label, url in targets.items():
                runs[label].append(_run(url, label, args))
        direct, routed = _latency(single.url, front.url, args.overhead_requests)
    rows = [max(r, key=lambda row: row["requests_s"]) for r in runs.values()]
    print(f"\n{'replicas':<20} {'req/s':>8} {'out tok/s':>10} {'p50 s':>7} {'prefill tok':>12}")
    for r in rows:
        print(
            f"{r['replicas']:<20} {r['requests_s']:>8.2f} {r['output_tok_s']:>10.1f} "
            f"{r['latency_p50_s']:>7.2f} {r['prefill_tokens_computed']:>12}"
        )
    overhead_ms = (routed - direct) * 1000
    print(
        f"\none-token request, median of {args.overhead_requests}: direct {direct * 1000:.1f} ms, "
        f"through the front and the router {routed * 1000:.1f} ms: {overhead_ms:+.1f} ms"
    )
    result = {
        "workload": "scaleout",
        "machine": machine(),
        "model": args.model or "default",
        "rows": rows,
        "runs": runs,
        "one_token_latency_direct_s": direct,
        "one_token_latency_routed_s": routed,
        "router_overhead_ms": overhead_ms,
    }
    write_result(result, args.json or Path("bench-results/scaleout.json"))
    return 0


def _run(url: str, label: str, args: argparse.Namespace) -> dict:
    prefixes = [f"Task {k}.\n{FEWSHOT_EXAMPLES}" for k in range(args.prefixes)]
    prompts = [
        f"{prefixes[i % args.prefixes]}Question: What is {i} plus {2 * i + 1}?\nAnswer:"
        for i in range(args.requests)
    ]
    sampling = {"max_new_tokens": args.tokens, "ignore_eos": True, "temperature": 0}

    async def send() -> tuple[float, list[float], int]:
        gate = asyncio.Semaphore(args.concurrency)
        async with httpx.AsyncClient(timeout=600) as http:

            async def one(prompt: str) -> float:
                async with gate:
                    start = time.perf_counter()
                    body = {"text": prompt, "sampling_params": sampling}
                    reply = await http.post(url + "/generate", json=body)
                    reply.raise_for_status()
                    return time.perf_counter() - start

            await asyncio.gather(*(one(p) for p in prompts[: args.prefixes]))  # warm-up
            httpx.post(url + "/flush_cache", timeout=60).raise_for_status()
            before = _prefill(url)
            start = time.perf_counter()
            latencies = await asyncio.gather(*(one(p) for p in prompts))
            return time.perf_counter() - start, latencies, _prefill(url) - before

    seconds, latencies, prefill = asyncio.run(send())
    return {
        "replicas": label,
        "requests_s": len(prompts) / seconds,
        "output_tok_s": len(prompts) * args.tokens / seconds,
        "latency_p50_s": statistics.median(latencies),
        "prefill_tokens_computed": prefill,
    }


def _prefill(url: str) -> int:
    return httpx.get(url + "/server_info", timeout=60).json()["stats"]["prefill_tokens_computed"]


def _latency(direct_url: str, routed_url: str, n: int) -> tuple[float, float]:
    """Median seconds of a one-token request with a short prompt, sent directly and through
    the front in turns."""
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    times: dict[str, list[float]] = {direct_url: [], routed_url: []}
    with httpx.Client(timeout=60) as http:
        for url in times:
            http.post(url + "/generate", json=body).raise_for_status()  # warm-up
        for _ in range(n):
            for url, seconds in times.items():
                start = time.perf_counter()
                http.post(url + "/generate", json=body).raise_for_status()
                seconds.append(time.perf_counter() - start)
    return statistics.median(times[direct_url]), statistics.median(times[routed_url])


class _Serve:
    """`braid serve FLAGS` on a free loopback port, until the block ends."""

    def __init__(self, args: argparse.Namespace, *flags: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "braid.runtime.cli", "serve", "--port", str(port)]
        command += ["--dtype", args.dtype, "--log-level", "warning", *flags]
        if args.model:
            command += ["--model", args.model]
        self.process = subprocess.Popen(command)

    def __enter__(self) -> _Serve:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"braid serve exited with code {self.process.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("braid serve did not start")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(60)
