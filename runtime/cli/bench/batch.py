"""`braid bench batch`: decode throughput at N concurrent requests, against the time of the
model's linear layers alone (the bound no engine can beat)."""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from braid.runtime.cli.bench.common import (
    add_workload,
    best_seconds,
    isolated,
    machine,
    make_engine,
    rss_mb,
    write_result,
)


def add_parser(workloads: argparse._SubParsersAction) -> None:
    batch = add_workload(
        workloads,
        "batch",
        "decode throughput at N concurrent requests vs the linear-layer bound",
        bench_batch,
    )
    batch.add_argument("--concurrency", type=int, default=64)
    batch.add_argument("--tokens", type=int, default=64)
    batch.add_argument(
        "--rss",
        action="store_true",
        help="also report resident memory after 100 and 1,000 requests",
    )
    batch.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")


def _braid_batch(model, dtype, n, tokens, rss) -> dict:
    from braid.runtime import SamplingParams

    engine = make_engine(model, dtype, prefix_cache=False)
    prompts = [engine.encode(f"Story {i}: Once upon a time") for i in range(n)]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4))
    runs = [_timed_batch(engine, prompts, params) for _ in range(2)]
    out = {
        "seconds": min(r["seconds"] for r in runs),
        "decode_seconds": min(r["decode_seconds"] for r in runs),
        "dtype": str(engine.dtype).removeprefix("torch."),
    }
    if rss:
        short = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        done = 0
        for total in (100, 1000):
            while done < total:
                ids = range(done, min(done + n, total))
                engine.generate([f"Request {i}: tell me something" for i in ids], short)
                done = ids.stop
            out[f"rss_mb_after_{total}"] = rss_mb()
    return out


def _timed_batch(
    engine, prompts: list[list[int]], params, loras: list[str | None] | None = None
) -> dict:
    """All prompts submitted at once, prompt i under LoRA adapter loras[i] (default: none).
    `seconds`: until the last finishes; `decode_seconds`: from the moment every request has
    its first token (the prefill is over) to the end."""
    first, last, left = {}, {}, threading.Semaphore(0)

    def emitter(i: int):
        def emit(chunk) -> None:
            now = time.perf_counter()
            if chunk.token_ids:
                first.setdefault(i, now)
            if chunk.finish_reason is not None:
                last[i] = now
                left.release()

        return emit

    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.submit(ids, params, emitter(i), lora=loras[i] if loras else None)
    for _ in prompts:
        left.acquire()
    end = max(last.values())
    return {"seconds": end - start, "decode_seconds": end - max(first.values())}


def _linear_bound_seconds(model, dtype, batch: int, steps: int) -> float:
    """Time of the model's linear layers alone (every nn.Linear once, as in a decode step,
    lm_head included) at `batch` rows, for `steps` steps: what no engine can beat."""
    from braid.runtime.loading.model_loader import load_model, load_model_config, resolve_model_dir

    path = resolve_model_dir(model)
    net = load_model(path, load_model_config(path), getattr(torch, dtype), torch.device("cpu"))
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {
        m.in_features: torch.randn(batch, m.in_features, dtype=getattr(torch, dtype))
        for m in linears
    }

    def run() -> None:
        with torch.no_grad():
            for _ in range(steps):
                for m in linears:
                    m(inputs[m.in_features])

    return best_seconds(run, 3)


def bench_batch(args: argparse.Namespace) -> int:
    n, tokens = args.concurrency, args.tokens
    # A shared machine's speed drifts within a minute (docs/benchmarks.md): the two sides
    # alternate and each keeps its best round, so a slow spell does not land on one side only.
    rates, decode_rates, bounds, first = [], [], [], None
    for round_ in range(args.rounds):
        out = isolated(_braid_batch, args.model, args.dtype, n, tokens, args.rss and not round_)
        first = first or out  # the round that measured memory
        rates.append(n * tokens / out["seconds"])
        # The decode phase: each request's tokens after its first, all 64 decoding together.
        decode_rates.append(n * (tokens - 1) / out["decode_seconds"])
        bounds.append(
            n * tokens / isolated(_linear_bound_seconds, args.model, out["dtype"], n, tokens)
        )
    rate, decode_rate, bound = max(rates), max(decode_rates), max(bounds)
    print(f"decode: {n} concurrent requests x {tokens} tokens, {out['dtype']}, {machine()}")
    print(f"{'':<40}{'tok/s':>10}{'/ bound':>10}")
    print(f"{'braid, decode phase':<40}{decode_rate:>10.1f}{decode_rate / bound:>10.1%}")
    print(f"{'braid, end to end (prefill included)':<40}{rate:>10.1f}{rate / bound:>10.1%}")
    print(f"{'linear layers alone (the bound)':<40}{bound:>10.1f}")
    # Rounds pair a braid run with the bound measured right after it: the median of those
    # ratios is less at the mercy of one fast or slow spell than the best of each side.
    paired = statistics.median(r / b for r, b in zip(decode_rates, bounds, strict=True))
    print(f"median over rounds of decode phase / bound: {paired:.1%}")
    result = {
        "workload": "batch",
        "machine": machine(),
        "dtype": out["dtype"],
        "concurrency": n,
        "new_tokens": tokens,
        "braid_decode_tok_s_per_round": [round(r, 1) for r in decode_rates],
        "braid_tok_s_per_round": [round(r, 1) for r in rates],
        "bound_tok_s_per_round": [round(b, 1) for b in bounds],
        "braid_decode_tok_s": round(decode_rate, 1),
        "braid_tok_s": round(rate, 1),
        "linear_bound_tok_s": round(bound, 1),
        "decode_fraction": round(decode_rate / bound, 3),
        "decode_fraction_median_of_rounds": round(paired, 3),
        "fraction": round(rate / bound, 3),
    }
    if args.rss:
        before, after = first["rss_mb_after_100"], first["rss_mb_after_1000"]
        print(
            f"resident memory after 100 requests: {before:.0f} MB, "
            f"after 1,000: {after:.0f} MB ({after / before - 1:+.1%})"
        )
        result["rss_mb_after_100"], result["rss_mb_after_1000"] = before, after
    write_result(result, args.json)
    return 0
