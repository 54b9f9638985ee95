"""`braid bench ...`: measured, never asserted. Each workload prints a table and writes JSON."""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

DECODE_PROMPT = "The history of the Roman Empire begins"


def add_parser(commands: argparse._SubParsersAction) -> None:
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
    batch.add_argument("--json", type=Path, default=Path("bench-results/batch.json"))
    batch.set_defaults(run=bench_batch)


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def _best_rate(fn, tokens: int, repeats: int) -> float:
    fn()  # warm-up: first-call allocations and kernel selection are not decode speed
    best = min(_timed(fn) for _ in range(repeats))
    return tokens / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _write(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def bench_decode(args: argparse.Namespace) -> int:
    import transformers

    from runtime import Engine, SamplingParams
    from runtime.model_loader import resolve_model_dir

    engine = Engine(model=args.model, dtype=args.dtype, max_kv_tokens=4096)
    dtype = engine.config.torch_dtype
    ids = engine.encode(DECODE_PROMPT)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    ours = _best_rate(lambda: engine.generate(ids, params), args.tokens, args.repeats)

    path = resolve_model_dir(args.model)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    ref.to(engine.device)
    x = torch.tensor([ids], device=engine.device)

    def hf_generate() -> None:
        with torch.no_grad():
            ref.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
            )

    theirs = _best_rate(hf_generate, args.tokens, args.repeats)
    result = {
        "workload": "decode",
        "machine": machine(),
        "model": str(path),
        "dtype": str(dtype),
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


# A few-shot prompt as an eval harness builds it: the same examples, then one question.
_FEWSHOT_EXAMPLES = "".join(
    f"Question: What is {a} plus {b}?\nAnswer: {a + b}\n\n"
    for a, b in [(12, 7), (30, 45), (8, 9), (100, 23), (61, 14), (5, 77), (19, 19), (44, 3)] * 3
)


def _fewshot_prompts(n: int) -> list[str]:
    return [
        f"{_FEWSHOT_EXAMPLES}Question: What is {i} plus {2 * i + 1}?\nAnswer:" for i in range(n)
    ]


def bench_fewshot(args: argparse.Namespace) -> int:
    import transformers

    from runtime import Engine, SamplingParams
    from runtime.model_loader import resolve_model_dir

    prompts = _fewshot_prompts(args.requests)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    rows = {}
    for cache in (True, False):
        engine = Engine(model=args.model, dtype=args.dtype, prefix_cache=cache, max_kv_tokens=65536)
        engine.generate(prompts[0], SamplingParams(temperature=0, max_tokens=2))
        engine.flush_cache()  # the timed run starts cold: the prefix is computed in it
        before = engine.stats()
        seconds = _timed(lambda: engine.generate(prompts, params))  # noqa: B023
        after = engine.stats()
        computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
        rows[f"braid (prefix cache {'on' if cache else 'off'})"] = (seconds, computed)
        dtype, device, tokenizer = engine.config.torch_dtype, engine.device, engine.tokenizer
        engine.shutdown()

    ref = (
        transformers.AutoModelForCausalLM.from_pretrained(
            resolve_model_dir(args.model), dtype=dtype
        )
        .to(device)
        .eval()
    )
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)

    def hf_generate() -> None:
        with torch.no_grad():
            ref.generate(
                **enc,
                do_sample=False,
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
                pad_token_id=tokenizer.pad_token_id,
            )

    hf_generate()  # warm-up
    rows["transformers.generate (one batch)"] = (_timed(hf_generate), int(enc.input_ids.numel()))
    prompt_len = len(tokenizer.encode(prompts[0]))
    print(
        f"few-shot: {args.requests} requests sharing a ~{prompt_len}-token prompt, "
        f"{args.tokens} new tokens each, {dtype}, {machine()}"
    )
    print(f"{'engine':<38}{'req/s':>8}{'prefill tokens':>16}{'speedup':>9}")
    base = rows["transformers.generate (one batch)"][0]
    for name, (seconds, computed) in rows.items():
        print(f"{name:<38}{args.requests / seconds:>8.2f}{computed:>16}{base / seconds:>8.1f}x")
    _write(
        {
            "workload": "fewshot",
            "machine": machine(),
            "dtype": str(dtype),
            "requests": args.requests,
            "new_tokens": args.tokens,
            "prompt_tokens": prompt_len,
            "rows": {
                k: {
                    "seconds": round(s, 3),
                    "req_s": round(args.requests / s, 3),
                    "prefill_tokens": c,
                }
                for k, (s, c) in rows.items()
            },
        },
        args.json,
    )
    return 0


def _linear_bound_seconds(model: torch.nn.Module, batch: int, steps: int) -> float:
    """Time of the model's linear layers alone (every nn.Linear once, as in a decode step,
    lm_head included) at `batch` rows, for `steps` steps: what no engine can beat."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    p = next(model.parameters())
    inputs = {
        m.in_features: torch.randn(batch, m.in_features, dtype=p.dtype, device=p.device)
        for m in linears
    }

    def one_step() -> None:
        with torch.no_grad():
            for m in linears:
                m(inputs[m.in_features])

    one_step()
    return min(_timed(lambda: [one_step() for _ in range(steps)]) for _ in range(3))


def bench_batch(args: argparse.Namespace) -> int:
    from runtime import Engine, SamplingParams

    engine = Engine(model=args.model, dtype=args.dtype, prefix_cache=False)
    n, tokens = args.concurrency, args.tokens
    prompts = [engine.encode(f"Story {i}: Once upon a time") for i in range(n)]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4))
    seconds = min(_timed(lambda: engine.generate(prompts, params)) for _ in range(2))
    rate = n * tokens / seconds
    bound = n * tokens / _linear_bound_seconds(engine.model, n, tokens)
    print(
        f"decode: {n} concurrent requests x {tokens} tokens, {engine.config.torch_dtype}, "
        f"{machine()}"
    )
    print(f"{'':<34}{'tok/s':>10}")
    print(f"{'braid':<34}{rate:>10.1f}")
    print(f"{'linear layers alone (the bound)':<34}{bound:>10.1f}")
    print(f"{'braid / bound':<34}{rate / bound:>10.1%}")
    result = {
        "workload": "batch",
        "machine": machine(),
        "dtype": str(engine.config.torch_dtype),
        "concurrency": n,
        "new_tokens": tokens,
        "braid_tok_s": round(rate, 1),
        "linear_bound_tok_s": round(bound, 1),
        "fraction": round(rate / bound, 3),
    }
    if args.rss:
        short = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        rss = {}
        for total in (100, 1000):
            done = 100 if total == 1000 else 0
            for start in range(done, total, n):
                ids = range(start, min(start + n, total))
                engine.generate([f"Request {i}: tell me something" for i in ids], short)
            rss[total] = _rss_mb()
        print(
            f"resident memory after 100 requests: {rss[100]:.0f} MB, "
            f"after 1,000: {rss[1000]:.0f} MB ({rss[1000] / rss[100] - 1:+.1%})"
        )
        result["rss_mb_after_100"], result["rss_mb_after_1000"] = rss[100], rss[1000]
    _write(result, args.json)
    return 0


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")
