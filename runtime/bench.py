"""`braid bench ...`: measured, never asserted. Each workload prints a table and writes JSON."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

DECODE_PROMPT = "The history of the Roman Empire begins"


def add_parser(
    commands: argparse._SubParsersAction,
    extra_workloads: Sequence[Callable[[argparse._SubParsersAction], None]] = (),
) -> None:
    bench = commands.add_parser("bench", help="run a benchmark workload")
    workloads = bench.add_subparsers(dest="workload", required=True, metavar="WORKLOAD")
    decode = workloads.add_parser(
        "decode", help="single-stream greedy decode: braid vs transformers.generate"
    )
    decode.add_argument("--model", help="HF model directory (default: the embedded model)")
    decode.add_argument("--dtype", default="auto")
    decode.add_argument("--tokens", type=int, default=128)
    decode.add_argument("--repeats", type=int, default=3)
    decode.add_argument("--json", type=Path, default=Path("bench-results/decode.json"))
    decode.set_defaults(run=bench_decode)

    fewshot = workloads.add_parser(
        "fewshot", help="shared few-shot prefix: braid (cache on/off) vs transformers batched"
    )
    fewshot.add_argument("--model")
    fewshot.add_argument("--dtype", default="auto")
    fewshot.add_argument("--requests", type=int, default=32)
    fewshot.add_argument("--tokens", type=int, default=16)
    fewshot.add_argument("--json", type=Path, default=Path("bench-results/fewshot.json"))
    fewshot.set_defaults(run=bench_fewshot)

    batch = workloads.add_parser(
        "batch", help="decode throughput at N concurrent requests vs the linear-layer bound"
    )
    batch.add_argument("--model")
    batch.add_argument("--dtype", default="auto")
    batch.add_argument("--concurrency", type=int, default=64)
    batch.add_argument("--tokens", type=int, default=64)
    batch.add_argument(
        "--rss",
        action="store_true",
        help="also report resident memory after 100 and 1,000 requests",
    )
    batch.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")
    batch.add_argument("--json", type=Path, default=Path("bench-results/batch.json"))
    batch.set_defaults(run=bench_batch)

    chat = workloads.add_parser(
        "chat", help="random chat-like prompt and output lengths: braid vs transformers"
    )
    chat.add_argument("--model")
    chat.add_argument("--dtype", default="auto")
    chat.add_argument("--requests", type=int, default=32)
    chat.add_argument("--seed", type=int, default=0)
    chat.add_argument("--json", type=Path, default=Path("bench-results/chat.json"))
    chat.set_defaults(run=bench_chat)

    from runtime import bench_grammar, bench_kernels, bench_serve, bench_spec

    bench_grammar.add_parser(workloads)
    bench_kernels.add_parser(workloads)
    bench_serve.add_parser(workloads)
    bench_spec.add_parser(workloads)
    for add in extra_workloads:
        add(workloads)


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def isolated(fn, *args):
    """Run fn(*args) in a fresh process and return its result.

    Each side of a comparison gets a process of its own: threads and OpenMP teams left by
    the other side (an engine thread, a transformers run) change the speed of the next.
    The process is not a daemon, so an engine in it may start its grammar worker.
    """
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_run_isolated, args=(sender, fn, args))
    process.start()
    sender.close()
    try:
        ok, value = receiver.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"{fn.__name__} died (exit code {process.exitcode})") from None
    process.join()
    if not ok:
        raise RuntimeError(f"{fn.__name__} failed:\n{value}")
    return value


def _run_isolated(conn, fn, args) -> None:
    import traceback

    try:
        conn.send((True, fn(*args)))
    except BaseException:
        conn.send((False, traceback.format_exc()))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first-call allocations and kernel selection are not the speed
    return min(_timed(fn) for _ in range(repeats))


def _write(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def _engine(model: str | None, dtype: str, **config):
    from runtime import Engine

    return Engine(model=model, dtype=dtype, **config)


def _hf_model(model: str | None, dtype: torch.dtype):
    import transformers

    from runtime.model_loader import resolve_model_dir

    path = resolve_model_dir(model)
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


# ---- decode: batch 1 -----------------------------------------------------------------------


def _braid_decode(model, dtype, tokens, repeats) -> tuple[float, list[int], str]:
    from runtime import SamplingParams

    engine = _engine(model, dtype, max_kv_tokens=4096)
    ids = engine.encode(DECODE_PROMPT)
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    seconds = _best_seconds(lambda: engine.generate(ids, params), repeats)
    return tokens / seconds, ids, str(engine.config.torch_dtype).removeprefix("torch.")


def _hf_decode(model, dtype, ids, tokens, repeats) -> float:
    ref = _hf_model(model, getattr(torch, dtype))
    x = torch.tensor([ids])

    def generate() -> None:
        with torch.no_grad():
            ref.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
            )

    return tokens / _best_seconds(generate, repeats)


def bench_decode(args: argparse.Namespace) -> int:
    ours, ids, dtype = isolated(_braid_decode, args.model, args.dtype, args.tokens, args.repeats)
    theirs = isolated(_hf_decode, args.model, dtype, ids, args.tokens, args.repeats)
    result = {
        "workload": "decode",
        "machine": machine(),
        "model": args.model or "default",
        "dtype": dtype,
        "prompt_tokens": len(ids),
        "new_tokens": args.tokens,
        "braid_tok_s": round(ours, 2),
        "transformers_tok_s": round(theirs, 2),
        "speedup": round(ours / theirs, 3),
    }
    print(
        f"decode, batch 1, {len(ids)}-token prompt, {args.tokens} new tokens, {dtype}, "
        f"{result['machine']}"
    )
    print(f"{'engine':<24}{'tok/s':>10}")
    print(f"{'braid':<24}{ours:>10.1f}")
    print(f"{'transformers.generate':<24}{theirs:>10.1f}")
    _write(result, args.json)
    return 0


# ---- few-shot: many requests sharing a long prompt ----------------------------------------

# A few-shot prompt as an eval harness builds it: the same examples, then one question.
_FEWSHOT_EXAMPLES = "".join(
    f"Question: What is {a} plus {b}?\nAnswer: {a + b}\n\n"
    for a, b in [(12, 7), (30, 45), (8, 9), (100, 23), (61, 14), (5, 77), (19, 19), (44, 3)] * 5
)


def _fewshot_prompts(n: int) -> list[str]:
    return [
        f"{_FEWSHOT_EXAMPLES}Question: What is {i} plus {2 * i + 1}?\nAnswer:" for i in range(n)
    ]


def _braid_fewshot(model, dtype, n, tokens, cache) -> tuple[float, int, str, int]:
    from runtime import SamplingParams

    engine = _engine(model, dtype, prefix_cache=cache, max_kv_tokens=65536)
    prompts = _fewshot_prompts(n)
    engine.generate(prompts[0], SamplingParams(temperature=0, max_tokens=2))
    engine.flush_cache()  # the timed run starts cold: the prefix is computed in it
    before = engine.stats()["prefill_tokens_computed"]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    seconds = _timed(lambda: engine.generate(prompts, params))
    computed = engine.stats()["prefill_tokens_computed"] - before
    dtype_name = str(engine.config.torch_dtype).removeprefix("torch.")
    return seconds, computed, dtype_name, len(engine.encode(prompts[0]))


def _hf_fewshot(model, dtype, n, tokens) -> tuple[float, int]:
    from runtime.model_loader import resolve_model_dir
    from runtime.tokenizer import load_tokenizer

    ref = _hf_model(model, getattr(torch, dtype))
    tokenizer = load_tokenizer(resolve_model_dir(model))
    tokenizer.padding_side = "left"
    enc = tokenizer(_fewshot_prompts(n), return_tensors="pt", padding=True)

    def generate() -> None:
        with torch.no_grad():
            ref.generate(
                **enc,
                do_sample=False,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=tokenizer.pad_token_id,
            )

    generate()  # warm-up
    return _timed(generate), int(enc.input_ids.numel())


def bench_fewshot(args: argparse.Namespace) -> int:
    n, tokens = args.requests, args.tokens
    rows = {}
    for cache in (True, False):
        seconds, computed, dtype, prompt_len = isolated(
            _braid_fewshot, args.model, args.dtype, n, tokens, cache
        )
        rows[f"braid (prefix cache {'on' if cache else 'off'})"] = (seconds, computed)
    rows["transformers.generate (one batch)"] = isolated(_hf_fewshot, args.model, dtype, n, tokens)
    print(
        f"few-shot: {n} requests sharing a ~{prompt_len}-token prompt, "
        f"{tokens} new tokens each, {dtype}, {machine()}"
    )
    print(f"{'engine':<38}{'req/s':>8}{'prefill tokens':>16}{'speedup':>9}")
    base = rows["transformers.generate (one batch)"][0]
    for name, (seconds, computed) in rows.items():
        print(f"{name:<38}{n / seconds:>8.2f}{computed:>16}{base / seconds:>8.1f}x")
    _write(
        {
            "workload": "fewshot",
            "machine": machine(),
            "dtype": dtype,
            "requests": n,
            "new_tokens": tokens,
            "prompt_tokens": prompt_len,
            "rows": {
                k: {"seconds": round(s, 3), "req_s": round(n / s, 3), "prefill_tokens": c}
                for k, (s, c) in rows.items()
            },
        },
        args.json,
    )
    return 0


# ---- batch: decode throughput at N concurrent requests -----------------------------------


def _braid_batch(model, dtype, n, tokens, rss) -> dict:
    from runtime import SamplingParams

    engine = _engine(model, dtype, prefix_cache=False)
    prompts = [engine.encode(f"Story {i}: Once upon a time") for i in range(n)]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4))
    runs = [_timed_batch(engine, prompts, params) for _ in range(2)]
    out = {
        "seconds": min(r["seconds"] for r in runs),
        "decode_seconds": min(r["decode_seconds"] for r in runs),
        "dtype": str(engine.config.torch_dtype).removeprefix("torch."),
    }
    if rss:
        short = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        done = 0
        for total in (100, 1000):
            while done < total:
                ids = range(done, min(done + n, total))
                engine.generate([f"Request {i}: tell me something" for i in ids], short)
                done = ids.stop
            out[f"rss_mb_after_{total}"] = _rss_mb()
    return out


def _timed_batch(engine, prompts: list[list[int]], params) -> dict:
    """All prompts submitted at once. `seconds`: until the last finishes; `decode_seconds`:
    from the moment every request has its first token (the prefill is over) to the end."""
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
        engine.submit(ids, params, emitter(i))
    for _ in prompts:
        left.acquire()
    end = max(last.values())
    return {"seconds": end - start, "decode_seconds": end - max(first.values())}


def _linear_bound_seconds(model, dtype, batch: int, steps: int) -> float:
    """Time of the model's linear layers alone (every nn.Linear once, as in a decode step,
    lm_head included) at `batch` rows, for `steps` steps: what no engine can beat."""
    from runtime.model_loader import load_model, load_model_config, resolve_model_dir

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

    return _best_seconds(run, 3)


def bench_batch(args: argparse.Namespace) -> int:
    n, tokens = args.concurrency, args.tokens
    # This machine's speed drifts by tens of percent over a minute: the two sides alternate
    # and each keeps its best round, so a slow spell does not land on one side only.
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
    _write(result, args.json)
    return 0


def _rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process (this one by default), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ---- chat: random prompt and output lengths, all arriving at once ---------------------------

_WORDS = (
    "the a model request cache token prefix batch answer question system user please explain "
    "how why when which memory fast slow graph kernel schedule queue latency of to in and"
).split()


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
    import threading

    from runtime import SamplingParams
    from runtime.stats import percentile

    engine = _engine(model, dtype, max_kv_tokens=65536)
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
        "dtype": str(engine.config.torch_dtype).removeprefix("torch."),
    }


def _hf_chat(model, dtype, n, seed, batch: int = 8) -> dict:
    """transformers.generate in left-padded batches of `batch`, each run to its longest
    reply; only the tokens each request asked for count."""
    from runtime.model_loader import resolve_model_dir
    from runtime.tokenizer import load_tokenizer

    ref = _hf_model(model, getattr(torch, dtype))
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
    _write(
        {"workload": "chat", "machine": machine(), "requests": args.requests,
         "braid": ours, "transformers": theirs},
        args.json,
    )  # fmt: skip
    return 0
