"""`braid bench spec`: speculative decoding against plain decoding on the default model.

Two workloads of chat prompts, greedy: copy-heavy (code edits, quoting, extraction: the reply
repeats much of the prompt) and free chat (the reply is new text). Each runs single-stream
(one request at a time) and with 8 requests at once. Every (workload, mode, method) run is a
fresh process, the methods alternate within each round, and each keeps its best round: a
shared machine's speed drifts over minutes (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import time

from braid.runtime.cli.bench.common import (
    add_workload,
    isolated,
    machine,
    make_engine,
    write_result,
)

_CODE = [
    """def parse_config(path):
    with open(path) as handle:
        lines = handle.read().splitlines()
    config = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config
""",
    """class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value

    def reset(self):
        self.value = 0
""",
    """def average(values):
    total = 0
    count = 0
    for value in values:
        total += value
        count += 1
    if count == 0:
        return 0
    return total / count
""",
]
_TEXT = [
    "The committee met on Tuesday to review the budget for the new library. Members agreed "
    "that the reading room needs better lighting and that the children's section should open "
    "on weekends. The treasurer reported that donations rose by twelve percent compared with "
    "last year, and the board approved a grant of four thousand dollars for new computers.",
    "Our hiking trip started at the north gate of the park at seven in the morning. The trail "
    "climbed steadily through pine forest for three miles before reaching the lake. We ate "
    "lunch on the rocks by the water, watched two eagles circle overhead, and returned by the "
    "eastern path, which was muddy after the storm the night before.",
]
COPY_PROMPTS = [
    f"Rename the function parse_config to load_settings in this code and return the full "
    f"code:\n\n{_CODE[0]}",
    f"Repeat the following paragraph exactly, word for word:\n\n{_TEXT[0]}",
    f"Extract every sentence that mentions money from this text, quoting them verbatim:"
    f"\n\n{_TEXT[0]}",
    f"Add a docstring to each method of this class and return the full code:\n\n{_CODE[1]}",
    f"Repeat the following paragraph exactly, word for word:\n\n{_TEXT[1]}",
    f"Rewrite this function so it uses the built-in sum and len, and return the full code:"
    f"\n\n{_CODE[2]}",
    f"Quote the sentence about the lake from this text, exactly as written:\n\n{_TEXT[1]}",
    f"Rename the variable config to settings in this code and return the full code:\n\n{_CODE[0]}",
]
CHAT_PROMPTS = [
    "Write a short story about a dragon who learns to cook.",
    "Explain how photosynthesis works to a ten-year-old.",
    "What are some good habits for staying focused while working from home?",
    "Write a poem about the ocean at night.",
    "Why is the sky blue? Answer in a few sentences.",
    "Give me three ideas for a birthday party for a seven-year-old.",
    "Describe a day in the life of a lighthouse keeper.",
    "What should I pack for a weekend camping trip?",
]
WORKLOADS = {"copy": COPY_PROMPTS, "chat": CHAT_PROMPTS}
MODES = {"single": 1, "8 concurrent": 8}
# method name -> engine fields
METHODS = {
    "none": {},
    "ngram": dict(spec_method="ngram"),
    "self-draft": dict(spec_method="draft", draft_model="self"),
}


def add_parser(workloads: argparse._SubParsersAction) -> None:
    spec = add_workload(
        workloads,
        "spec",
        "speculative decoding vs plain decoding: copy-heavy prompts and free chat",
        bench_spec,
    )
    spec.add_argument("--tokens", type=int, default=128, help="max new tokens per request")
    spec.add_argument("--rounds", type=int, default=2, help="alternating rounds per method")
    spec.add_argument(
        "--methods",
        default="none,ngram",
        help=f"comma-separated, the first is the baseline (from {', '.join(METHODS)})",
    )


def _run(model, dtype, method: str, workload: str, concurrency: int, tokens: int) -> dict:
    """One method on one workload in this (fresh) process: the requests in groups of
    `concurrency`, each group submitted at once; the time from first submission to last
    finish, the outputs, and the spec counters."""
    from braid.runtime import SamplingParams

    engine = make_engine(model, dtype, max_kv_tokens=32768, **METHODS[method])
    tok = engine.tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in WORKLOADS[workload][: 4 if concurrency == 1 else concurrency]
    ]
    params = SamplingParams(temperature=0, max_tokens=tokens)
    engine.generate("Warm up: say hello.", SamplingParams(temperature=0, max_tokens=8))
    before = engine.stats()
    start = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), concurrency):
        outs += engine.generate(prompts[i : i + concurrency], params)
    seconds = time.perf_counter() - start
    after = engine.stats()
    engine.shutdown()
    counters = ("spec_steps", "spec_proposed_tokens", "spec_accepted_tokens", "decode_tokens")
    delta = {k: after[k] - before[k] for k in counters}
    return {
        "seconds": seconds,
        "output_tokens": sum(len(o.token_ids) for o in outs),
        "outputs": [o.token_ids for o in outs],
        "sample": outs[0].text[:120],
        "dtype": str(engine.dtype).removeprefix("torch."),
        **delta,
    }


def bench_spec(args: argparse.Namespace) -> int:
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown or len(methods) < 2:
        raise ValueError(f"--methods: give two or more of {', '.join(METHODS)}; got {methods}")
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        for workload in WORKLOADS:
            for mode, concurrency in MODES.items():
                # Alternate which method goes first, so a drift in speed within a round does
                # not always land on the same side.
                order = methods if round_ % 2 == 0 else methods[::-1]
                for method in order:
                    load = os.getloadavg()[0]  # other work on this machine, for the record
                    out = isolated(
                        _run, args.model, args.dtype, method, workload, concurrency, args.tokens
                    )
                    out["load_before"] = round(load, 2)
                    runs.setdefault((workload, mode, method), []).append(out)
                    rate = out["output_tokens"] / out["seconds"]
                    print(
                        f"round {round_ + 1}: {workload}, {mode}, {method}: {rate:.1f} tok/s "
                        f"(load average before: {load:.2f})"
                    )
    base = methods[0]
    dtype = runs[(next(iter(WORKLOADS)), next(iter(MODES)), base)][0]["dtype"]
    print(
        f"\nspeculative decoding, greedy, up to {args.tokens} new tokens per request, {dtype}, "
        f"{machine()}, best of {args.rounds} rounds, each run a fresh process"
    )
    header = f"{'workload':<10}{'mode':<14}{'method':<12}{'tok/s':>8}{'speedup':>9}"
    print(header + f"{'accepted/proposed':>19}{'per step':>10}{'same output':>13}")
    rows = []
    for workload in WORKLOADS:
        for mode in MODES:
            reference = max(
                runs[(workload, mode, base)], key=lambda o: o["output_tokens"] / o["seconds"]
            )
            base_rate = reference["output_tokens"] / reference["seconds"]
            for method in methods:
                best = max(
                    runs[(workload, mode, method)], key=lambda o: o["output_tokens"] / o["seconds"]
                )
                rate = best["output_tokens"] / best["seconds"]
                steps, proposed, accepted = (
                    best["spec_steps"], best["spec_proposed_tokens"], best["spec_accepted_tokens"]
                )  # fmt: skip
                row = {
                    "workload": workload,
                    "mode": mode,
                    "method": method,
                    "tok_s": round(rate, 1),
                    "tok_s_per_round": [
                        round(o["output_tokens"] / o["seconds"], 1)
                        for o in runs[(workload, mode, method)]
                    ],
                    "speedup": round(rate / base_rate, 3),
                    "output_tokens": best["output_tokens"],
                    "spec_steps": steps,
                    "spec_proposed_tokens": proposed,
                    "spec_accepted_tokens": accepted,
                    "same_output_as_baseline": best["outputs"] == reference["outputs"],
                    "load_average_before_each_round": [
                        o["load_before"] for o in runs[(workload, mode, method)]
                    ],
                    "sample": best["sample"],
                }
                rows.append(row)
                acceptance = f"{accepted}/{proposed}" if proposed else "-"
                per_step = f"{accepted / steps:.2f}" if steps else "-"
                print(
                    f"{workload:<10}{mode:<14}{method:<12}{rate:>8.1f}{rate / base_rate:>8.2f}x"
                    f"{acceptance:>19}{per_step:>10}"
                    f"{'yes' if row['same_output_as_baseline'] else 'NO':>13}"
                )
    write_result(
        {"workload": "spec", "machine": machine(), "dtype": dtype, "rounds": args.rounds,
         "max_tokens": args.tokens, "rows": rows},
        args.json,
    )  # fmt: skip
    return 0
