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
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0
