"""`braid bench decode`: single-stream greedy decode, braid against transformers.generate."""

from __future__ import annotations

import argparse

import torch

from braid.runtime.cli.bench.common import (
    add_workload,
    best_seconds,
    hf_model,
    isolated,
    machine,
    make_engine,
    write_result,
)

DECODE_PROMPT = "The history of the Roman Empire begins"


def add_parser(workloads: argparse._SubParsersAction) -> None:
    decode = add_workload(
        workloads,
        "decode",
        "single-stream greedy decode: braid vs transformers.generate",
        bench_decode,
    )
    decode.add_argument("--tokens", type=int, default=128)
    decode.add_argument("--repeats", type=int, default=3)
    decode.add_argument(
        "--quantization", default="auto", help="braid's: auto, none, int8, int4, gguf"
    )


def _braid_decode(model, dtype, quantization, tokens, repeats) -> tuple[float, list[int], str]:
    from braid.runtime import SamplingParams

    engine = make_engine(model, dtype, max_kv_tokens=4096, quantization=quantization)
    ids = engine.encode(DECODE_PROMPT)
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    seconds = best_seconds(lambda: engine.generate(ids, params), repeats)
    return tokens / seconds, ids, str(engine.dtype).removeprefix("torch.")


def _hf_decode(model, dtype, ids, tokens, repeats) -> float:
    ref = hf_model(model, getattr(torch, dtype))
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

    return tokens / best_seconds(generate, repeats)


def bench_decode(args: argparse.Namespace) -> int:
    ours, ids, dtype = isolated(
        _braid_decode, args.model, args.dtype, args.quantization, args.tokens, args.repeats
    )
    theirs = isolated(_hf_decode, args.model, dtype, ids, args.tokens, args.repeats)
    result = {
        "workload": "decode",
        "machine": machine(),
        "model": args.model or "default",
        "dtype": dtype,
        "quantization": args.quantization,
        "prompt_tokens": len(ids),
        "new_tokens": args.tokens,
        "braid_tok_s": round(ours, 2),
        "transformers_tok_s": round(theirs, 2),
        "speedup": round(ours / theirs, 3),
    }
    print(
        f"decode, batch 1, {len(ids)}-token prompt, {args.tokens} new tokens, {dtype}, "
        f"braid quantization {args.quantization}, {result['machine']}"
    )
    print(f"{'engine':<24}{'tok/s':>10}")
    print(f"{'braid':<24}{ours:>10.1f}")
    print(f"{'transformers.generate':<24}{theirs:>10.1f}")
    write_result(result, args.json)
    return 0
