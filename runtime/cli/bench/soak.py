"""`braid bench soak --minutes M`: mixed traffic against a live server for M minutes, then
the checks that long runs leave nothing behind.

Clients send the mix of `soak_traffic` (plain, streamed, constrained with a new schema or
regex each time, n > 1, logprobs, streams that leave, requests aborted mid-way, requests
past a limit, and hostile clients: one never reading its stream, one leaving a slow
compile, an oversized body, a tenant probing another's) while a burst past the queue limit
comes every --burst-every seconds. A
warm-up of the same traffic comes first (first-time allocations: the vocabulary's tries,
the KV pool's pages, a full grammar cache); the server is then let go idle, its cache
flushed, and measured: the start. Each minute prints requests by outcome, resident memory
(the server's and its compile workers'), free KV tokens, grammar memory and p50/p99
latency; after the last the server goes idle again and is measured: the end.

Fails (exit code 1) when a request was lost (see soak_traffic), when a well-behaved
request waited longer than --max-wait-s for its answer, when the server does not come back
to idle with every KV slot free, or when its resident memory (with its compile workers')
ends more than 10% above the start.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict, dataclass

import httpx

from braid.runtime.cli.bench.common import ServeProcess, add_workload, machine, write_result
from braid.runtime.cli.bench.soak_traffic import CLEAN, HOSTILE, Result, Traffic
from braid.runtime.stats import percentile

# Resident memory may end this much above the start (allocator noise, not growth).
RSS_TOLERANCE = 0.10
_OUTCOMES = ("complete", "left", "aborted", "refused", "rejected", "held")
# The keys of the server the soak starts: two tenants (the traffic's and the prober's) and
# the admin's (the flush before each measurement).
_KEYS = ("soak-tenant-a", "soak-tenant-b")
_ADMIN_KEY = "soak-admin"


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = add_workload(
        workloads,
        "soak",
        "mixed traffic for --minutes: memory, KV and latency must hold, nothing lost",
        bench_soak,
    )
    p.add_argument("--minutes", type=float, default=30.0, help="length of the measured run")
    p.add_argument(
        "--warmup-minutes",
        type=float,
        help="the warm-up (default: a quarter of --minutes, 5 at most)",
    )
    p.add_argument(
        "--url", help="soak a running server (default: start `braid serve` with the flags below)"
    )
    p.add_argument("--clients", type=int, default=8, help="concurrent clients")
    p.add_argument(
        "--burst-every",
        type=float,
        default=20.0,
        help="seconds between bursts past the queue limit",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-wait-s",
        type=float,
        default=120.0,
        help="longest a well-behaved request may wait for its whole answer",
    )
    p.add_argument("--api-key", help="with --url: the traffic's API key")
    p.add_argument(
        "--other-api-key",
        help="with --url: a second tenant's key (under --cache-scope key), for the tenant probe",
    )
    p.add_argument("--admin-api-key", help="with --url: the admin key, for /flush_cache")
    server = p.add_argument_group("the server it starts")
    server.add_argument("--max-kv-tokens", type=int, default=4096)
    server.add_argument("--max-running-requests", type=int, default=16)
    server.add_argument(
        "--max-queued-requests", type=int, default=16, help="small, so that bursts pass it"
    )
    server.add_argument(
        "--grammar-memory-mb", type=int, default=16, help="small, so that the soak evicts grammars"
    )


@dataclass
class Sample:
    """The server as one reading of /metrics and /server_info sees it."""

    rss_mb: float
    workers_rss_mb: float
    kv_free_tokens: int
    kv_cached_tokens: int
    kv_total_tokens: int
    grammar_mb: float
    grammar_evictions: int
    running: int
    waiting: int
    active_sequences: int

    @property
    def memory_mb(self) -> float:
        """What the memory check compares: the server and its compile workers."""
        return self.rss_mb + self.workers_rss_mb


def bench_soak(args: argparse.Namespace) -> int:
    if args.url:
        result = asyncio.run(soak(args.url, args))
    else:
        flags = ["--dtype", args.dtype, "--log-level", "warning"]
        for name in ("max_kv_tokens", "max_running_requests", "max_queued_requests"):
            flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
        flags += ["--grammar-memory-mb", str(args.grammar_memory_mb)]
        # Two tenants and an admin; a short write deadline, so that the client that never
        # reads is dropped within the run.
        flags += [f"--api-key={_KEYS[0]}", f"--api-key={_KEYS[1]}", "--cache-scope", "key"]
        flags += ["--admin-api-key", _ADMIN_KEY, "--write-timeout-s", "5"]
        args.api_key, args.other_api_key, args.admin_api_key = *_KEYS, _ADMIN_KEY
        with ServeProcess(args.model, flags) as server:
            result = asyncio.run(soak(server.url, args))
    result |= {"machine": machine(), "model": args.url or args.model or "default"}
    write_result(result, args.json)
    return 0 if result["ok"] else 1


async def soak(url: str, args: argparse.Namespace) -> dict:
    limits = httpx.Limits(max_connections=None)
    timeout = httpx.Timeout(600)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    admin = {"authorization": f"Bearer {args.admin_api_key}"} if args.admin_api_key else {}
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=timeout, headers=headers
    ) as http:
        info = (await http.get("/server_info")).json()
        traffic = Traffic(http, args.seed, args.other_api_key)
        burst = info["queue_capacity"] + args.clients  # past the limit even when all are idle
        warmup = args.warmup_minutes
        if warmup is None:
            warmup = min(5.0, args.minutes / 4)
        await _run(traffic, args, burst, warmup * 60, [])
        start = await _settle(http, admin)
        print(
            f"soak: {args.minutes:g} min of mixed traffic after a {warmup:g} min warm-up, "
            f"{args.clients} clients, a burst of {burst} every {args.burst_every:g} s"
        )
        print(_HEADER)
        print(_sample_row("start", start))
        results: list[Result] = []
        rows: list[dict] = []
        t0 = time.monotonic()
        monitor = asyncio.create_task(_monitor(http, t0, args.minutes, results, rows))
        await _run(traffic, args, burst, args.minutes * 60, results)
        await monitor
        end = await _settle(http, admin)
        print(_sample_row("end", end))
    lost = [r for r in results if r.outcome not in CLEAN]
    idle = end.running == end.waiting == end.active_sequences == 0
    kv_ok = end.kv_free_tokens + end.kv_cached_tokens == end.kv_total_tokens
    growth = end.memory_mb / start.memory_mb - 1
    waits = [r.latency_s for r in results if r.latency_s is not None and r.kind not in HOSTILE]
    longest = max(waits, default=0.0)
    waited_ok = longest <= args.max_wait_s
    ok = not lost and idle and kv_ok and growth <= RSS_TOLERANCE and waited_ok
    budget = info.get("grammar_memory_mb")
    print(
        f"{len(results)} requests: {_counts(results)}; lost {len(lost)}"
        + "".join(f"\n  lost: {r.kind}: {r.outcome}" for r in lost[:10])
    )
    print(
        f"longest well-behaved request {longest:.1f} s (at most {args.max_wait_s:g} s): "
        f"{'yes' if waited_ok else 'NO'}; hostile requests "
        f"{sum(r.kind in HOSTILE for r in results)}"
    )
    print(
        f"grammar memory {start.grammar_mb:.1f} -> {end.grammar_mb:.1f} MB (budget {budget} MB), "
        f"{end.grammar_evictions - start.grammar_evictions} evicted meanwhile"
    )
    print(
        f"idle after: {'yes' if idle else 'NO'}, KV free + cached == total: "
        f"{'yes' if kv_ok else 'NO'}; memory (server + compile workers) {start.memory_mb:.0f} "
        f"-> {end.memory_mb:.0f} MB ({growth:+.1%}, at most {RSS_TOLERANCE:+.0%}) "
        f"-> {'OK' if ok else 'FAILED'}"
    )
    return {
        "workload": "soak",
        "minutes": args.minutes,
        "warmup_minutes": warmup,
        "clients": args.clients,
        "burst": burst,
        "grammar_budget_mb": budget,
        "start": asdict(start),
        "end": asdict(end),
        "minutes_rows": rows,
        "outcomes": _counts(results),
        "lost": [asdict(r) for r in lost],
        "memory_growth": growth,
        "longest_wait_s": longest,
        "max_wait_s": args.max_wait_s,
        "idle": idle,
        "kv_ok": kv_ok,
        "ok": ok,
    }


async def _run(
    traffic: Traffic, args: argparse.Namespace, burst: int, seconds: float, out: list[Result]
) -> None:
    """The clients' traffic and the bursts for `seconds`, results into `out`."""
    deadline = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < deadline:
            out.append(await traffic.one())
            if out[-1].outcome == "refused":  # as a client would, back off from a full server
                await asyncio.sleep(0.5)

    async def bursts() -> None:
        while True:
            await asyncio.sleep(min(args.burst_every, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                return
            out.extend(await asyncio.gather(*(traffic.one("plain") for _ in range(burst))))

    await asyncio.gather(bursts(), *(client() for _ in range(args.clients)))


async def _monitor(
    http: httpx.AsyncClient, t0: float, minutes: float, results: list[Result], rows: list[dict]
) -> None:
    """At the end of each minute: a row of that minute's requests and a sample."""
    for minute in range(1, int(minutes) + 1):
        await asyncio.sleep(max(0.0, t0 + 60 * minute - time.monotonic()))
        sample = await _sample(http)
        done = [r for r in results if t0 + 60 * (minute - 1) <= r.end < t0 + 60 * minute]
        latencies = sorted(r.latency_s for r in done if r.latency_s is not None)
        row = {
            "minute": minute,
            "requests": len(done),
            "outcomes": _counts(done),
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
            **asdict(sample),
        }
        rows.append(row)
        print(_minute_row(row))


async def _settle(http: httpx.AsyncClient, admin: dict, timeout: float = 300) -> Sample:
    """Wait until nothing runs, drop the prefix cache, let the compile threads measure the
    grammar cache again (they do every second while idle), and sample."""
    deadline = time.monotonic() + timeout
    while True:
        sample = await _sample(http)
        if sample.running == sample.waiting == sample.active_sequences == 0:
            break
        if time.monotonic() > deadline:
            return sample
        await asyncio.sleep(0.1)
    await http.post("/flush_cache", headers=admin)
    await asyncio.sleep(2.0)  # the engine trims its heap once idle; the compile threads re-measure
    return await _sample(http)


async def _sample(http: httpx.AsyncClient) -> Sample:
    metrics = _parse_metrics((await http.get("/metrics")).text)
    info = (await http.get("/server_info")).json()
    s = info["stats"]
    return Sample(
        rss_mb=metrics.get("process_resident_memory_bytes", float("nan")) / 2**20,
        workers_rss_mb=s["grammar_workers_resident_bytes"] / 2**20,
        kv_free_tokens=s["kv_slots_free"],
        kv_cached_tokens=s["kv_slots_cached"],
        kv_total_tokens=s["kv_slots_total"],
        grammar_mb=s["grammar_memory_bytes"] / 2**20,
        grammar_evictions=s["grammar_cache_evictions"],
        running=s["running_requests"],
        waiting=s["waiting_requests"],
        active_sequences=info["active_sequences"],
    )


def _parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: unlabelled samples by name."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def _counts(results: list[Result]) -> dict[str, int]:
    counts = {o: 0 for o in _OUTCOMES}
    for r in results:
        key = r.outcome if r.outcome in CLEAN else "lost"
        counts[key] = counts.get(key, 0) + 1
    return counts


_HEADER = (
    f"{'minute':>7}{'reqs':>6}{'done':>6}{'left':>6}{'abort':>6}{'503':>5}{'400':>5}{'held':>5}"
    f"{'lost':>5}"
    f"{'RSS MB':>8}{'workers':>8}{'KV free':>8}{'grammar MB':>11}{'p50 s':>7}{'p99 s':>7}"
)


def _minute_row(row: dict) -> str:
    c = row["outcomes"]
    p50, p99 = row["p50_s"], row["p99_s"]
    return (
        f"{row['minute']:>7}{row['requests']:>6}{c['complete']:>6}{c['left']:>6}"
        f"{c['aborted']:>6}{c['refused']:>5}{c['rejected']:>5}{c['held']:>5}{c.get('lost', 0):>5}"
        f"{row['rss_mb']:>8.0f}{row['workers_rss_mb']:>8.0f}{row['kv_free_tokens']:>8}"
        f"{row['grammar_mb']:>11.1f}{_seconds(p50):>7}{_seconds(p99):>7}"
    )


def _sample_row(label: str, s: Sample) -> str:
    return (
        f"{label:>7}{'':>44}{s.rss_mb:>8.0f}{s.workers_rss_mb:>8.0f}{s.kv_free_tokens:>8}"
        f"{s.grammar_mb:>11.1f}"
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
