"""`braid bench reasoning`: answers held to a JSON schema after a thought, against the same
requests with a free answer, and against the schema from the first token (no thought).

Extraction tasks, each with its schema, asked with the model's chat template and a prompt
that opens the thought (`<think>` after the generation prompt, as DeepSeek-R1's template
does); a soft thinking budget bounds it. The default model has no think tokens, so it runs
with `--reasoning-format think`: the tags are several tokens each, matched token by token.
All of a mode's requests run at once, greedy; the modes alternate over the rounds and each
keeps its best round (a shared machine's speed drifts). Validity: the answer (the text after
the thought) parses as JSON and validates against the task's schema.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

from braid.runtime.cli.bench.common import add_workload, machine, make_engine, write_result

_PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
_EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "day": {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]},
        "attendees": {"type": "integer", "minimum": 0},
    },
    "required": ["event", "day", "attendees"],
    "additionalProperties": False,
}
_VERDICT = {
    "type": "object",
    "properties": {"answer": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["answer", "reason"],
    "additionalProperties": False,
}
TASKS = [
    ("Extract the person: 'Maria Lopez, 34, joined the team in May.'", _PERSON),
    ("Extract the person: 'Our new intern, Tom Becker (21), starts Monday.'", _PERSON),
    ("Extract the event: 'The design review is on Tuesday with 12 people.'", _EVENT),
    ("Extract the event: 'Friday's launch party expects 40 guests.'", _EVENT),
    ("Is 17 a prime number?", _VERDICT),
    ("Is the Pacific the largest ocean?", _VERDICT),
    ("Does water boil at 50 degrees Celsius at sea level?", _VERDICT),
    ("Extract the person: 'Dr. Chen, aged 58, leads the lab.'", _PERSON),
]
SYSTEM = "Think briefly inside <think></think>, then give only the JSON answer the user asks for."
MODES = ("thought, free answer", "thought, schema answer", "schema from the first token")


def add_parser(workloads: argparse._SubParsersAction) -> None:
    parser = add_workload(
        workloads,
        "reasoning",
        "constrained answers after a thought vs free answers vs the schema from token one",
        bench_reasoning,
    )
    parser.add_argument("--budget", type=int, default=48, help="thinking budget (soft)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)


def _answer_valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def bench_reasoning(args: argparse.Namespace) -> int:
    from braid.runtime import SamplingParams
    from braid.runtime.text.reasoning import prompt_opening
    from braid.runtime.text.thought_split import splitter

    engine = make_engine(args.model, args.dtype, reasoning_format="think")
    fmt = engine.reasoning_format
    asked = [
        engine.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for task, _ in TASKS
    ]
    thinking = [engine.encode(p + fmt.start + "\n") for p in asked]
    plain = [engine.encode(p) for p in asked]

    def params(mode: str, schema: dict) -> SamplingParams:
        common = dict(temperature=0, max_tokens=args.max_tokens)
        if mode == MODES[2]:
            return SamplingParams(json_schema=schema, **common)
        held = dict(json_schema=schema) if mode == MODES[1] else {}
        return SamplingParams(reasoning=True, thinking_budget=args.budget, **held, **common)

    def run(mode: str) -> dict:
        prompts = plain if mode == MODES[2] else thinking
        jobs = [
            (ids, params(mode, schema)) for ids, (_, schema) in zip(prompts, TASKS, strict=True)
        ]
        start = time.perf_counter()
        with ThreadPoolExecutor(len(jobs)) as pool:  # all at once, each with its schema
            outs = list(pool.map(lambda job: engine.generate(*job), jobs))
        seconds = time.perf_counter() - start
        valid, reasoning = 0, 0
        for ids, out, (_, schema) in zip(prompts, outs, TASKS, strict=True):
            answer = out.text
            if mode != MODES[2]:
                reader = splitter(fmt, prompt_opening(fmt, engine.tokenizer, ids))
                events = reader.feed(out.text) + reader.finish()
                answer = "".join(e[1] for e in events if e[0] == "text")
                reasoning += out.meta.get("reasoning_tokens", 0)
            valid += _answer_valid(answer, schema)
        tokens = sum(len(o.token_ids) for o in outs)
        return {
            "mode": mode,
            "requests": len(outs),
            "output_tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            "valid": valid,
            "mean_reasoning_tokens": reasoning / len(outs),
        }

    run(MODES[1])  # warm-up: compiles the schemas, first-call allocations
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for mode in MODES:
            row = run(mode)
            if mode not in best or row["tokens_per_s"] > best[mode]["tokens_per_s"]:
                best[mode] = row
    print(f"machine: {machine()}; budget {args.budget} (soft), max_tokens {args.max_tokens}")
    print(f"{'mode':30} {'valid':>7} {'tok/s':>8} {'out tok':>8} {'thought':>8}")
    for row in best.values():
        print(
            f"{row['mode']:30} {row['valid']:>3}/{row['requests']:<3} "
            f"{row['tokens_per_s']:>8.1f} {row['output_tokens']:>8} "
            f"{row['mean_reasoning_tokens']:>8.1f}"
        )
    result = {"machine": machine(), "budget": args.budget, "rows": list(best.values())}
    write_result(result, args.json)
    engine.shutdown()
    return 0
