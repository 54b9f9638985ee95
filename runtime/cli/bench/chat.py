"""`braid bench chat`: chat-like traffic, random prompt and output lengths, all arriving at
once: braid against transformers.generate in padded batches."""

from __future__ import annotations

import argparse
import threading
import time

import torch

from braid.runtime.cli.bench.common import (
    add_workload,
    hf_model,
    isolated,
    machine,
    make_engine,
    write_result,
)

_WORDS = (
    "the a model request cache token prefix batch answer question system user please explain "
    "how why when which memory fast slow graph kernel schedule queue latency of to in and"
).split()


def add_parser(workloads: argparse._SubParsersAction) -> None:
    chat = add_workload(
        workloads,
        "chat",
        "random chat-like prompt and output lengths: braid vs transformers",
        bench_chat,
    )
    chat.add_argument("--requests", type=int, default=32)
    chat.add_argument("--seed", type=int, default=0)


def _chat_workload(n: int, seed: int) -> list[tuple[list[dict], int]]:
    """(messages, output tokens) pairs: a shared system prompt, user turns of 10-300 words
    (long-tailed, as chat traffic is), replies of 16-128 tokens."""
    import random

    rng = random.Random(seed)
    system = {"role": "system", "content": "You are a concise assistant for engineers."}
    out = []
    for _ in range(n):
        words = min(300, max(10, int(rng.lognormvariate(4.0, 0.8))))
        text = " ".join(rng.choice(_WORDS) for _ in range(words))
        out.append(([system, {"role": "user", "content": text}], rng.randint(16, 128)))
    return out


def _braid_chat(model, dtype, n, seed) -> dict:
    from braid.runtime import SamplingParams
    from braid.runtime.stats import percentile

    engine = make_engine(model, dtype, max_kv_tokens=65536)
    work = _chat_workload(n, seed)
    prompts = [
        engine.tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
        for m, _ in work
    ]
    engine.generate("warm up", SamplingParams(max_tokens=2))
    engine.flush_cache()
    before = engine.stats()
    done = threading.Semaphore(0)
    first: dict[int, float] = {}
    last: dict[int, tuple[float, int]] = {}

    def emitter(i: int):
        count = 0

        def emit(chunk) -> None:
            nonlocal count
            now = time.perf_counter()
            count += len(chunk.token_ids)
            if chunk.token_ids and i not in first:
                first[i] = now
            if chunk.finish_reason is not None:
                last[i] = (now, count)
                done.release()

        return emit

    start = time.perf_counter()
    for i, (prompt, (_, tokens)) in enumerate(zip(prompts, work, strict=True)):
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        engine.submit(prompt, params, emitter(i))
    for _ in work:
        done.acquire()
    seconds = time.perf_counter() - start
    after = engine.stats()
    ttft = sorted(first[i] - start for i in range(n))
    tpot = sorted((last[i][0] - first[i]) / max(1, last[i][1] - 1) for i in range(n))
    prompt_tokens = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    return {
        "seconds": seconds,
        "output_tokens": sum(c for _, c in last.values()),
        "prompt_tokens": prompt_tokens,
        "prefill_tokens_computed": after["prefill_tokens_computed"]
        - before["prefill_tokens_computed"],
        "cache_hit_rate": cached / prompt_tokens,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p99_s": percentile(tpot, 99),
        "dtype": str(engine.dtype).removeprefix("torch."),
    }


def _hf_chat(model, dtype, n, seed, batch: int = 8) -> dict:
    """transformers.generate in left-padded batches of `batch`, each run to its longest
    reply; only the tokens each request asked for count."""
    from braid.runtime.loading.model_loader import resolve_model_dir
    from braid.runtime.text.tokenizer import load_tokenizer

    ref = hf_model(model, getattr(torch, dtype))
    tokenizer = load_tokenizer(resolve_model_dir(model))
    tokenizer.padding_side = "left"
    work = _chat_workload(n, seed)
    start = time.perf_counter()
    for i in range(0, n, batch):
        part = work[i : i + batch]
        texts = [
            tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
            for m, _ in part
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        longest = max(t for _, t in part)
        with torch.no_grad():
            ref.generate(
                **enc,
                do_sample=False,
                max_new_tokens=longest,
                min_new_tokens=longest,
                pad_token_id=tokenizer.pad_token_id,
            )
    return {"seconds": time.perf_counter() - start, "output_tokens": sum(t for _, t in work)}


def bench_chat(args: argparse.Namespace) -> int:
    ours = isolated(_braid_chat, args.model, args.dtype, args.requests, args.seed)
    theirs = isolated(_hf_chat, args.model, ours["dtype"], args.requests, args.seed)
    print(
        f"chat: {args.requests} requests at once, prompts {ours['prompt_tokens']} tokens in all, "
        f"replies 16-128 tokens, {ours['dtype']}, {machine()}"
    )
    print(
        f"{'engine':<34}{'tok/s':>8}{'TTFT p50/p99 s':>18}{'TPOT p50/p99 ms':>18}"
        f"{'prefill':>9}{'hit':>6}"
    )
    print(
        f"{'braid':<34}{ours['output_tokens'] / ours['seconds']:>8.1f}"
        f"{ours['ttft_p50_s']:>9.2f}/{ours['ttft_p99_s']:<8.2f}"
        f"{ours['tpot_p50_s'] * 1e3:>9.1f}/{ours['tpot_p99_s'] * 1e3:<8.1f}"
        f"{ours['prefill_tokens_computed']:>9}{ours['cache_hit_rate']:>6.0%}"
    )
    print(
        f"{'transformers.generate (batches 8)':<34}"
        f"{theirs['output_tokens'] / theirs['seconds']:>8.1f}{'-':>18}{'-':>18}"
    )
    write_result(
        {"workload": "chat", "machine": machine(), "requests": args.requests,
         "braid": ours, "transformers": theirs},
        args.json,
    )  # fmt: skip
    return 0
