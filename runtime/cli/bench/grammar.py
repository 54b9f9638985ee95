"""`braid bench grammar`: JSON-schema constraints on our corpus (grammar_corpus.py), on the
model end to end (here: constrained vs free decoding), and on MaskBench (grammar_maskbench.py,
with a peer engine from grammar_peer.py)."""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

from braid.runtime.cli.bench.common import add_workload, isolated, machine, write_result
from braid.runtime.cli.bench.grammar_cases import CORPUS_DIR, load_test_suite
from braid.runtime.cli.bench.grammar_corpus import bench_corpus
from braid.runtime.cli.bench.grammar_maskbench import bench_maskbench, maskbench_cases


def add_parser(workloads: argparse._SubParsersAction) -> None:
    grammar = add_workload(
        workloads,
        "grammar",
        "JSON-schema constraints: compile and mask times, MaskBench score",
        bench_grammar,
        model=False,
    )
    grammar.add_argument("--model", help="HF model directory for the tokenizer (default model)")
    grammar.add_argument("--corpus", type=Path, default=CORPUS_DIR)
    grammar.add_argument("--maskbench", type=Path, help="MaskBench directory (one JSON a schema)")
    grammar.add_argument(
        "--test-suite",
        type=Path,
        help="JSON-Schema-Test-Suite directory (a checkout's tests/draft2020-12), scored as "
        "MaskBench is: one schema a test group",
    )
    grammar.add_argument("--limit", type=int, help="score a seeded sample of this many schemas")
    grammar.add_argument("--seed", type=int, default=0)
    grammar.add_argument("--jobs", type=int, default=1, help="MaskBench worker processes")
    grammar.add_argument("--timeout", type=float, default=30.0, help="compile limit, seconds")
    grammar.add_argument("--memory-mb", type=int, default=2048, help="compile memory limit")
    grammar.add_argument(
        "--skip-e2e", action="store_true", help="skip constrained vs free decoding on the model"
    )
    grammar.add_argument(
        "--peer-python",
        help="MaskBench and --test-suite: also score llguidance, installed in this Python (its "
        "own venv, never braid's), on the same schemas and tokenizer",
    )
    grammar.add_argument(
        "--spec-objects",
        action="store_true",
        help="MaskBench: compile with JsonSchema(strict=False), which writes unlisted properties "
        "wherever additionalProperties does not forbid them, as the spec reads",
    )


def bench_grammar(args: argparse.Namespace) -> int:
    result: dict[str, Any] = {"workload": "grammar", "machine": machine()}
    result["corpus"] = bench_corpus(args.model, args.corpus)
    if not args.skip_e2e:
        result["end_to_end"] = _bench_end_to_end(args.model)
    if args.maskbench:
        cases = maskbench_cases(args.maskbench, args.limit, args.seed)
        per_schema_path = args.json.with_name(args.json.stem + "-maskbench.json")
        result["maskbench"] = bench_maskbench(args, cases, per_schema_path, "MaskBench")
    if args.test_suite:
        cases = load_test_suite(args.test_suite)
        per_schema_path = args.json.with_name(args.json.stem + "-test-suite.json")
        result["test_suite"] = bench_maskbench(
            args, cases, per_schema_path, "JSON-Schema-Test-Suite"
        )
    write_result(result, args.json)
    return 0


# ---- end to end: constrained vs unconstrained decoding on the model -----------------------

_PEOPLE = [
    "Alice Moreau, 34, is a structural engineer in Lyon; reach her at alice@moreau.fr.",
    "Kenji Watanabe (52) teaches physics in Osaka and has no email.",
    "Our new intern, Sam Patel, is 21 and lives in Leeds. Email: sam.patel@example.com",
    "Dr. Maria Gonzalez, aged 45, runs a clinic in Seville.",
    "Tom Berg is 29, a chef from Oslo, tom@berg.no.",
    "Priya Nair, 38, data scientist, Bangalore.",
    "Lukas Novak works as a pilot out of Prague; he is 41.",
    "Grace Okafor, 27, nurse in Lagos, grace.okafor@mail.ng.",
]
_PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "job": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 30},
        "email": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},
    },
    "required": ["name", "age", "job", "city", "email"],
    "additionalProperties": False,
}


def _bench_end_to_end(model: str | None) -> dict:
    """The same extraction prompts, greedy, free and under a JSON schema, each in a fresh
    engine: output tokens per second and time per output token. Jump-forward appends the
    forced keys and punctuation without a forward each."""
    rows = {
        "unconstrained": isolated(_end_to_end_run, model, None),
        "json_schema": isolated(_end_to_end_run, model, _PERSON),
    }
    print(f"end to end, {len(_PEOPLE)} extraction requests at once, greedy, {machine()}")
    print(
        f"{'':<16}{'tokens':>8}{'seconds':>9}{'tok/s':>8}{'TPOT p50 ms':>13}{'jump-fwd':>10}"
        f"{'valid':>7}{'ages right':>12}"
    )
    for label, row in rows.items():
        print(
            f"{label:<16}{row['output_tokens']:>8}{row['seconds']:>9.2f}"
            f"{row['tokens_per_s']:>8.1f}{row['tpot_p50_s'] * 1e3:>13.1f}"
            f"{row['jump_forward_tokens']:>10}{row['valid']:>7}{row['ages_right']:>12}"
        )
    print(f"json_schema sample: {rows['json_schema']['sample']}\n")
    return rows


def _end_to_end_run(model: str | None, schema: dict | None) -> dict:
    from braid.runtime import Engine, SamplingParams

    engine = Engine(model=model, max_kv_tokens=8192)
    constraint = {"json_schema": schema} if schema else {}
    try:
        prompts = [
            engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": f"Extract name, age, job, city, email as JSON: {p}"}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for p in _PEOPLE
        ]
        # Warm up, and compile the schema: the timed run measures decoding, not compiling.
        engine.generate("warm up", SamplingParams(max_tokens=4, **constraint))
        engine.flush_cache()
        before = engine.stats()["jump_forward_tokens"]
        params = SamplingParams(temperature=0, max_tokens=96, **constraint)
        start = time.perf_counter()
        outs = engine.generate(prompts, params)
        seconds = time.perf_counter() - start
        stats = engine.stats()
    finally:
        engine.shutdown()
    tokens = sum(len(o.token_ids) for o in outs)
    answers = [_answer(o.text) for o in outs]
    return {
        "requests": len(outs),
        "output_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "tpot_p50_s": stats["tpot_p50_s"],
        "jump_forward_tokens": stats["jump_forward_tokens"] - before,
        "valid": sum(_valid(a) for a in answers),
        # Each note states one number, the person's age: whether the answer kept it.
        "ages_right": sum(
            _valid(a) and a["age"] == int(re.search(r"\d+", p).group())
            for a, p in zip(answers, _PEOPLE, strict=True)
        ),
        "sample": outs[0].text[:200],
    }


def _answer(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _valid(answer: object) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator(_PERSON).is_valid(answer)
