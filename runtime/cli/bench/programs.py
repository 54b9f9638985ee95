"""`braid bench programs`: a few-shot eval harness written as programs, run as one batch
with the prefix cache on and off, against the same programs as independent
transformers.generate calls. Measured, never asserted."""

from __future__ import annotations

import argparse
import time

import torch

from braid import gen, program
from braid.runtime.cli.bench.common import (
    FEWSHOT_EXAMPLES,
    add_workload,
    hf_model,
    isolated,
    machine,
    make_engine,
    write_result,
)

_QUESTION = "Question: What is {a} plus {b}?\nAnswer:"
_CHECK = "\nIs that right? Answer yes or no:"


@program
def harness(s, a: int, b: int, answer_tokens: int):
    """Two steps per program: answer, then judge the answer."""
    s += FEWSHOT_EXAMPLES + _QUESTION.format(a=a, b=b)
    s += gen("answer", max_tokens=answer_tokens, ignore_eos=True)
    s += _CHECK
    s += gen("check", max_tokens=2, ignore_eos=True)


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = add_workload(
        workloads,
        "programs",
        "few-shot harness programs: braid run_batch (cache on/off) vs transformers calls",
        bench_programs,
    )
    p.add_argument("--programs", type=int, default=32)
    p.add_argument("--tokens", type=int, default=8, help="answer tokens per program")


def _batch(n: int, tokens: int) -> list[dict]:
    return [{"a": i, "b": 2 * i + 1, "answer_tokens": tokens} for i in range(n)]


def _braid_programs(model, dtype, n, tokens, cache) -> tuple[float, int, int, str]:
    from braid.interpreter import LocalBackend

    engine = make_engine(model, dtype, prefix_cache=cache, max_kv_tokens=65536)
    backend = LocalBackend(engine)
    greedy = {"temperature": 0}
    harness.run(**_batch(1, tokens)[0], backend=backend, sampling=greedy)  # warm-up
    engine.flush_cache()  # the timed run starts cold: the prefix is computed in it
    before = engine.stats()
    t = time.perf_counter()
    states = harness.run_batch(_batch(n, tokens), backend=backend, sampling=greedy, concurrency=n)
    seconds = time.perf_counter() - t
    failed = [s.error for s in states if s.error is not None]
    if failed:
        raise failed[0]
    after = engine.stats()
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    return seconds, prompt, computed, str(engine.dtype).removeprefix("torch.")


def _hf_programs(model, dtype, n, tokens) -> float:
    """The same two steps per program as plain generate calls, one program after another."""
    from braid.runtime.loading.model_loader import resolve_model_dir
    from braid.runtime.text.tokenizer import load_tokenizer

    ref = hf_model(model, getattr(torch, dtype))
    tokenizer = load_tokenizer(resolve_model_dir(model))

    def call(prompt: str, new_tokens: int) -> str:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = ref.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.eos_token_id,
            )
        return tokenizer.decode(out[0, ids.shape[1] :])

    def run_program(kw: dict) -> None:
        prompt = FEWSHOT_EXAMPLES + _QUESTION.format(a=kw["a"], b=kw["b"])
        prompt += call(prompt, tokens) + _CHECK
        call(prompt, 2)

    run_program(_batch(1, tokens)[0])  # warm-up
    t = time.perf_counter()
    for kw in _batch(n, tokens):
        run_program(kw)
    return time.perf_counter() - t


def bench_programs(args: argparse.Namespace) -> int:
    n, tokens = args.programs, args.tokens
    rows = {}
    for cache in (True, False):
        seconds, prompt, computed, dtype = isolated(
            _braid_programs, args.model, args.dtype, n, tokens, cache
        )
        rows[f"braid run_batch (prefix cache {'on' if cache else 'off'})"] = (seconds, computed)
    hf_seconds = isolated(_hf_programs, args.model, dtype, n, tokens)
    rows["transformers.generate, one call per gen"] = (hf_seconds, None)
    print(
        f"programs: {n} few-shot harness programs (2 gens each: {tokens} + 2 tokens; "
        f"{prompt} prompt tokens in all), {dtype}, {machine()}"
    )
    print(f"{'engine':<44}{'programs/s':>11}{'prefill computed':>18}{'speedup':>9}")
    for name, (seconds, computed) in rows.items():
        shown = "-" if computed is None else f"{computed:,}"
        print(f"{name:<44}{n / seconds:>11.2f}{shown:>18}{hf_seconds / seconds:>8.1f}x")
    write_result(
        {
            "workload": "programs",
            "machine": machine(),
            "dtype": dtype,
            "programs": n,
            "answer_tokens": tokens,
            "prompt_tokens": prompt,
            "rows": {
                k: {"seconds": round(s, 3), "programs_s": round(n / s, 3), "prefill_tokens": c}
                for k, (s, c) in rows.items()
            },
        },
        args.json,
    )
    return 0
