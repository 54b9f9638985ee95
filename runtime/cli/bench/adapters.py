"""`braid bench lora`: decode throughput of N concurrent requests spread over A LoRA adapters
against the same N requests on the base model alone: one engine, the same prompts, greedy,
a fixed number of tokens each.

The adapters are random (rank `--rank`, every target module), written as PEFT saves them
(adapter_config.json + adapter_model.safetensors) for the model's shapes, so no peft and no
float copy of a quantized model are needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from braid.runtime.cli.bench.batch import _timed_batch
from braid.runtime.cli.bench.common import (
    add_workload,
    isolated,
    machine,
    make_engine,
    write_result,
)


def add_parser(workloads: argparse._SubParsersAction) -> None:
    lora = add_workload(
        workloads,
        "lora",
        "throughput of concurrent requests over many LoRA adapters vs the base model alone",
        bench_lora,
    )
    lora.add_argument("--rank", type=int, default=16)
    lora.add_argument("--adapters", type=int, default=8)
    lora.add_argument("--requests", type=int, default=64)
    lora.add_argument("--tokens", type=int, default=64)
    lora.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")


def write_random_adapter(out_dir: Path, model: str | None, rank: int, seed: int) -> Path:
    """A random LoRA adapter targeting every module PEFT names in a Llama block, in PEFT's
    files and tensor names, for the model's shapes; returns its directory."""
    from braid.runtime.loading.model_loader import load_model_config, resolve_model_dir
    from braid.runtime.lora.adapter import TARGETS, _part_sizes

    config = load_model_config(resolve_model_dir(model))
    sizes = _part_sizes(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for module, (linear, _) in TARGETS.items():
            stem = f"base_model.model.model.layers.{layer}.{linear.split('.')[0]}.{module}"
            in_features, out_features = sizes[module]
            # PEFT's A init scale; B nonzero (a trained adapter's), small enough to keep the
            # output text-like.
            a = torch.randn(rank, in_features, generator=generator) / in_features**0.5
            b = torch.randn(out_features, rank, generator=generator) * 0.01
            tensors[f"{stem}.lora_A.weight"], tensors[f"{stem}.lora_B.weight"] = a, b
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = dict(
        peft_type="LORA", r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS), bias="none"
    )
    (out_dir / "adapter_config.json").write_text(json.dumps(settings))
    save_file(tensors, out_dir / "adapter_model.safetensors")
    return out_dir


def _rounds(model, dtype, rank, num_adapters, n, tokens, rounds) -> dict:
    """In one engine: each round times the base batch, then the same batch spread over the
    adapters (request i under adapter i mod A); the sides alternate so that a slow spell of
    this machine does not land on one only."""
    from braid.runtime import SamplingParams

    with tempfile.TemporaryDirectory() as tmp:  # kept while the engine may reload from it
        paths = {
            f"a{i}": str(write_random_adapter(Path(tmp, f"a{i}"), model, rank, seed=i))
            for i in range(num_adapters)
        }
        # No prefix cache: every round computes its prompts again, on both sides alike.
        engine = make_engine(model, dtype, prefix_cache=False, lora_adapters=paths)
        try:
            prompts = [engine.encode(f"Story {i}: Once upon a time") for i in range(n)]
            names = [f"a{i % num_adapters}" for i in range(n)]
            params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
            warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
            _timed_batch(engine, prompts[:4], warm)
            _timed_batch(engine, prompts[:4], warm, names[:4])
            base, lora = [], []
            for _ in range(rounds):
                base.append(_timed_batch(engine, prompts, params))
                lora.append(_timed_batch(engine, prompts, params, names))
            return {"dtype": str(engine.dtype).removeprefix("torch."), "base": base, "lora": lora}
        finally:
            engine.shutdown()


def bench_lora(args: argparse.Namespace) -> int:
    n, tokens, rank, num_adapters = args.requests, args.tokens, args.rank, args.adapters
    out = isolated(_rounds, args.model, args.dtype, rank, num_adapters, n, tokens, args.rounds)

    def rates(side: str, key: str, per_request: int) -> list[float]:
        return [n * per_request / r[key] for r in out[side]]

    # End to end (prefill included) and the decode phase (every request past its first token).
    base, lora = rates("base", "seconds", tokens), rates("lora", "seconds", tokens)
    base_decode = rates("base", "decode_seconds", tokens - 1)
    lora_decode = rates("lora", "decode_seconds", tokens - 1)
    best = {"base": max(base), "lora": max(lora), "bd": max(base_decode), "ld": max(lora_decode)}
    print(
        f"lora: {n} concurrent requests x {tokens} tokens, {num_adapters} adapters of rank "
        f"{rank} (all 7 targets), {out['dtype']}, {machine()}, best of {args.rounds} rounds"
    )
    print(f"{'':<34}{'tok/s':>10}{'decode tok/s':>14}")
    print(f"{'base model alone':<34}{best['base']:>10.1f}{best['bd']:>14.1f}")
    print(f"{f'spread over {num_adapters} adapters':<34}", end="")
    print(f"{best['lora']:>10.1f}{best['ld']:>14.1f}")
    ratio, decode_ratio = best["lora"] / best["base"], best["ld"] / best["bd"]
    print(f"{'adapters / base':<34}{ratio:>10.1%}{decode_ratio:>14.1%}")
    # Each round's two sides ran back to back: the median of their ratios is less at the
    # mercy of one fast or slow spell than the best of each side.
    paired = statistics.median(a / b for a, b in zip(lora, base, strict=True))
    print(f"median over rounds of adapters / base: {paired:.1%}")
    result = {
        "workload": "lora",
        "machine": machine(),
        "model": args.model,
        "dtype": out["dtype"],
        "rank": rank,
        "adapters": num_adapters,
        "requests": n,
        "new_tokens": tokens,
        "rounds": args.rounds,
        "base_tok_s_per_round": [round(r, 1) for r in base],
        "lora_tok_s_per_round": [round(r, 1) for r in lora],
        "base_tok_s": round(best["base"], 1),
        "lora_tok_s": round(best["lora"], 1),
        "base_decode_tok_s": round(best["bd"], 1),
        "lora_decode_tok_s": round(best["ld"], 1),
        "ratio": round(ratio, 3),
        "decode_ratio": round(decode_ratio, 3),
        "ratio_median_of_rounds": round(paired, 3),
    }
    write_result(result, args.json)
    return 0
