"""`braid bench agents`: ReAct-style agent programs under KV pressure, with program leases on
and off in the same run. Measured, never asserted.

Each program: a shared system prompt with few-shot examples, then 5-8 turns of a thought and
a JSON-constrained action (each agent has its own tools, so its own schema), a simulated
tool with latency, and the tool's observation. They run concurrently; the KV pool is sized
to a fraction of their total live context (every program's final context), and once to
more than all of it (no pressure). The prefill an infinite cache would compute is the
no-pressure run's. "wait" is how long a gen waits for its constraint once it runs: compiled
ahead, it was sent to compile when the gen was submitted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import threading
import time
from collections.abc import Callable

from braid import assistant, gen, program, system, user
from braid.runtime.cli.bench.common import (
    add_workload,
    isolated,
    machine,
    make_engine,
    write_result,
)

_WORDS = (
    "river stone market ledger signal harbor copper meadow lantern archive valley orbit "
    "thunder garden velvet compass timber glacier beacon canyon pepper saddle quartz engine"
).split()

SYSTEM = (
    "You are an agent that solves tasks with tools. Each turn, think in one line, then give "
    "one action as JSON with the tool to call and its input. Tools answer with an "
    "observation. Finish when you know the answer.\n\n"
    + "".join(
        f"Example {i}:\nTask: find the {w} record\nThought: I should search for it.\n"
        f'Action: {{"tool": "search", "input": "{w} record"}}\n'
        f"Observation: the {w} record is in archive {i}.\n"
        f'Thought: I know the answer.\nAction: {{"tool": "finish", "input": "archive {i}"}}\n\n'
        for i, w in enumerate(_WORDS[:6])
    )
)


def _schema(agent: int) -> dict:
    """Agent `agent`'s action: its own tool names, so each agent compiles its own schema."""
    tools = [f"search_{agent}", f"calc_{agent}", f"lookup_{agent}", "finish"]
    return {
        "type": "object",
        "properties": {
            "tool": {"enum": tools},
            "input": {"type": "string", "maxLength": 40},
        },
        "required": ["tool", "input"],
    }


def _observation(agent: int, turn: int, words: int) -> str:
    rng = random.Random(agent * 1000 + turn)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


@program
def react(s, agent: int, turns: int, latency: float, words: int, done: Callable[[], None]):
    s += system(SYSTEM)
    s += user(f"Task: find the {_WORDS[agent % len(_WORDS)]} record for agent {agent}.")
    for turn in range(turns):
        s += assistant(
            "Thought: "
            + gen(f"thought{turn}", max_tokens=16, stop="\n")
            + "\nAction: "
            + gen(f"action{turn}", json_schema=_schema(agent), max_tokens=40)
        )
        s[f"action{turn}"]  # noqa: B018 (the tool needs this turn's action)
        time.sleep(latency)  # the tool runs
        s += user("Observation: " + _observation(agent, turn, words))
    done()


class _Timed:
    """A LocalBackend as the interpreter sees it, timing how long each gen waits for its
    constraint once it runs (compiled ahead: at its submission, unless `ahead` is off)."""

    def __init__(self, backend, ahead: bool) -> None:
        self.backend = backend
        self.chat_template = backend.chat_template
        self.generation_openings = backend.generation_openings
        self.reasoning_format = backend.reasoning_format
        self.waits: list[float] = []
        self.release_program = backend.release_program
        self.compile_ahead = backend.compile_ahead if ahead else lambda params: None

    async def generate(self, prompt, params, on_text, lora=None, program=None):
        if params.constraint is not None:
            t = time.perf_counter()
            await asyncio.wrap_future(self.backend.engine.prepare(params))
            self.waits.append(time.perf_counter() - t)
        return await self.backend.generate(prompt, params, on_text, lora, program)

    async def score(self, *args, **kw):
        return await self.backend.score(*args, **kw)


def _run(model, dtype, n, words, latency, pool, leases, ahead=True) -> dict:
    from braid.interpreter import LocalBackend

    engine = make_engine(model, dtype, max_kv_tokens=pool, program_leases=leases)
    backend = _Timed(LocalBackend(engine), ahead)
    rng = random.Random(0)
    ends: dict[int, float] = {}
    lock = threading.Lock()

    def finisher(i: int) -> Callable[[], None]:
        def done() -> None:
            with lock:
                ends[i] = time.perf_counter()

        return done

    batch = [
        {"agent": i, "turns": rng.randint(5, 8), "latency": latency, "words": words}
        for i in range(n)
    ]
    react.run(**batch[0], done=lambda: None, backend=backend, temperature=0)  # warm-up
    engine.flush_cache()
    backend.waits.clear()
    before = engine.stats()
    start = time.perf_counter()
    states = react.run_batch(
        [{**kw, "done": finisher(i)} for i, kw in enumerate(batch)],
        backend=backend,
        concurrency=n,
        temperature=0,
    )
    seconds = time.perf_counter() - start
    failed = [s.error for s in states if s.error is not None]
    if failed:
        raise failed[0]
    after = engine.stats()
    latencies = sorted(ends[i] - start for i in range(n))
    context = sum(len(engine.encode(s.text())) for s in states)
    engine.shutdown()
    return {
        "seconds": seconds,
        "programs_s": n / seconds,
        "p50_s": statistics.median(latencies),
        "p99_s": latencies[min(n - 1, round(0.99 * (n - 1)))],
        "prefill_computed": after["prefill_tokens_computed"] - before["prefill_tokens_computed"],
        "preemptions": after["preemptions"] - before["preemptions"],
        "live_context": context,
        "constraint_wait_p50_ms": 1000 * statistics.median(backend.waits),
        "constraint_wait_max_ms": 1000 * max(backend.waits),
    }


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = add_workload(
        workloads,
        "agents",
        "ReAct agent programs under KV pressure: program leases on vs off",
        bench_agents,
    )
    p.add_argument("--programs", type=int, default=16)
    p.add_argument("--words", type=int, default=80, help="words per tool observation")
    p.add_argument("--latency", type=float, default=0.3, help="seconds per tool call")
    p.add_argument(
        "--fraction", type=float, default=0.25, help="KV pool / total live context under pressure"
    )


def bench_agents(args: argparse.Namespace) -> int:
    n, words, latency = args.programs, args.words, args.latency
    common = (args.model, args.dtype, n, words, latency)
    rows: dict[str, dict] = {}
    roomy = isolated(_run, *common, 1 << 20, False)
    live = roomy["live_context"]
    pool = max(1024, int(args.fraction * live))
    rows[f"pool {pool:,} tokens ({args.fraction:g} of live), leases off"] = isolated(
        _run, *common, pool, False
    )
    rows[f"pool {pool:,} tokens ({args.fraction:g} of live), leases on"] = isolated(
        _run, *common, pool, True
    )
    rows[f"pool {pool:,}, leases on, no ahead-of-time compile"] = isolated(
        _run, *common, pool, True, False
    )
    rows["no pressure, leases off"] = roomy
    rows["no pressure, leases on"] = isolated(_run, *common, 1 << 20, True)
    infinite = roomy["prefill_computed"]
    print(
        f"agents: {n} ReAct programs (5-8 turns, {words}-word observations, {latency:g} s "
        f"tools), {live:,} tokens of live context, {machine()}"
    )
    header = f"{'run':<58}{'prog/s':>8}{'p50 s':>7}{'p99 s':>7}{'prefill':>9}{'x inf':>7}"
    print(header + f"{'wait ms p50/max':>17}")
    for name, r in rows.items():
        print(
            f"{name:<58}{r['programs_s']:>8.2f}{r['p50_s']:>7.1f}{r['p99_s']:>7.1f}"
            f"{r['prefill_computed']:>9,}{r['prefill_computed'] / infinite:>7.2f}"
            f"{r['constraint_wait_p50_ms']:>10.2f}/{r['constraint_wait_max_ms']:<6.1f}"
        )
    write_result(
        {
            "workload": "agents",
            "machine": machine(),
            "programs": n,
            "words": words,
            "latency_s": latency,
            "live_context": live,
            "pool": pool,
            "infinite_cache_prefill": infinite,
            "rows": rows,
        },
        args.json,
    )
    return 0
