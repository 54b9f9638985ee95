"""`braid bench fewshot`: many requests sharing a long few-shot prompt, braid with the prefix
cache on and off against transformers.generate on one batch."""

from __future__ import annotations

import argparse

import torch

from braid.runtime.cli.bench.common import (
    FEWSHOT_EXAMPLES,
    add_workload,
    hf_model,
    isolated,
    machine,
    make_engine,
    timed,
    write_result,
)


def add_parser(workloads: argparse._SubParsersAction) -> None:
    fewshot = add_workload(
        workloads,
        "fewshot",
        "shared few-shot prefix: braid (cache on/off) vs transformers batched",
        bench_fewshot,
    )
    fewshot.add_argument("--requests", type=int, default=32)
    fewshot.add_argument("--tokens", type=int, default=16)


def _fewshot_prompts(n: int) -> list[str]:
    return [f"{FEWSHOT_EXAMPLES}Question: What is {i} plus {2 * i + 1}?\nAnswer:" for i in range(n)]


def _braid_fewshot(model, dtype, n, tokens, cache) -> tuple[float, int, str, int]:
    from braid.runtime import SamplingParams

    engine = make_engine(model, dtype, prefix_cache=cache, max_kv_tokens=65536)
    prompts = _fewshot_prompts(n)
    engine.generate(prompts[0], SamplingParams(temperature=0, max_tokens=2))
    engine.flush_cache()  # the timed run starts cold: the prefix is computed in it
    before = engine.stats()["prefill_tokens_computed"]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    seconds = timed(lambda: engine.generate(prompts, params))
    computed = engine.stats()["prefill_tokens_computed"] - before
    dtype_name = str(engine.dtype).removeprefix("torch.")
    return seconds, computed, dtype_name, len(engine.encode(prompts[0]))


def _hf_fewshot(model, dtype, n, tokens) -> tuple[float, int]:
    from braid.runtime.loading.model_loader import resolve_model_dir
    from braid.runtime.text.tokenizer import load_tokenizer

    ref = hf_model(model, getattr(torch, dtype))
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
    return timed(generate), int(enc.input_ids.numel())


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
    write_result(
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
