"""`braid bench grammar`: JSON-schema constraints on our corpus and on MaskBench.

Our corpus (tests/data/schemas) gives compile times (cold and cached), the time to fill one
mask (TBM) and the coverage table for the README. MaskBench (JSONSchemaBench's mask corpus)
is scored as /work/shared/data/README.md describes: per schema, compile (time to first mask,
TTFM), then feed each test instance token by token to a fresh matcher, filling the mask
before every token; a schema passes when valid instances are accepted to the end (then EOS)
and invalid ones are rejected somewhere. Each schema runs in a worker process that is killed
past a deadline, so a schema that hangs or blows memory is a compile error, never a stall.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from braid.runtime.cli.bench.common import add_workload, isolated, machine, write_result

CORPUS_DIR = Path(__file__).resolve().parents[3] / "tests" / "data" / "schemas"

# Published MaskBench figures (11,306 schemas, Llama-3.1 tokenizer), from the data README:
# engine -> (passing, invalidation errors, TBM p50 us, TBM p99 us, TTFM p50 ms).
MASKBENCH_SCHEMAS = 11_306
PUBLISHED = {
    "llguidance 0.7.10": (8_909, 0, 46, 533, 1.0),
    "XGrammar 0.1.17": (8_122, 1_368, 9, 5_687, 919),
    "outlines-core 0.2.3": (7_050, 822, 34, 7_184, 588),
    "llama.cpp grammars": (6_505, 649, 17_021, 60_371, 0.3),
}


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
        help="MaskBench: also score llguidance, installed in this Python (its own venv, never "
        "braid's), on the same schemas and tokenizer",
    )
    grammar.add_argument(
        "--spec-objects",
        action="store_true",
        help="MaskBench: compile with JsonSchema(strict=False), which writes unlisted properties "
        "wherever additionalProperties does not forbid them, as the spec reads",
    )


# ---- shared: corpus files, instance serialization, feeding a matcher -----------------------


@dataclass(frozen=True)
class SchemaCase:
    """One corpus or MaskBench file."""

    name: str
    description: str
    schema: Any
    tests: tuple[tuple[bool, Any], ...]  # (valid, data)
    expect: str | None = None  # corpus only: "compiled" or "rejected"
    reject_reason: str | None = None


def load_case(path: Path) -> SchemaCase:
    doc = json.loads(path.read_text())
    return SchemaCase(
        name=path.stem,
        description=doc.get("description", ""),
        schema=doc["schema"],
        tests=tuple((t["valid"], t["data"]) for t in doc.get("tests", [])),
        expect=doc.get("expect"),
        reject_reason=doc.get("reject_reason"),
    )


def load_corpus(directory: Path = CORPUS_DIR) -> list[SchemaCase]:
    return [load_case(p) for p in sorted(directory.glob("*.json"))]


def serialize(data: Any, schema: Any) -> str:
    """The instance as the grammar expects it: compact, properties in schema order."""
    ordered = _SchemaOrder(schema).order(data, schema)
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False)


class _SchemaOrder:
    """Reorders an instance's object keys: the properties the schema lists, in its order (the
    object's own, then allOf parts, then the anyOf/oneOf branch the value matches), then
    required names it does not list, then any other keys as they came."""

    def __init__(self, root: Any) -> None:
        from jsonschema import Draft202012Validator
        from jsonschema.validators import validator_for

        self.root = root
        self.validator = validator_for(root, default=Draft202012Validator)(root)

    def order(self, value: Any, schema: Any) -> Any:
        parts = self.parts(schema, value, 0)
        if isinstance(value, dict):
            subschemas: dict[str, Any] = {}
            for part in parts:
                props = part.get("properties")
                for name, sub in props.items() if isinstance(props, dict) else ():
                    subschemas.setdefault(name, sub)
            for part in parts:
                required = part.get("required")
                for name in required if isinstance(required, list) else ():
                    subschemas.setdefault(name, True)
            extra = next(
                (p["additionalProperties"] for p in parts if "additionalProperties" in p), True
            )
            keys = [k for k in subschemas if k in value] + [k for k in value if k not in subschemas]
            return {k: self.order(value[k], subschemas.get(k, extra)) for k in keys}
        if isinstance(value, list):
            prefix: list = []
            items: Any = True
            for part in parts:
                listed = part.get("prefixItems", part.get("items"))
                if isinstance(listed, list) and not prefix:
                    prefix = listed
                elif "items" in part and not isinstance(part["items"], list) and items is True:
                    items = part["items"]
            return [
                self.order(v, prefix[i] if i < len(prefix) else items) for i, v in enumerate(value)
            ]
        return value

    def parts(self, schema: Any, value: Any, depth: int) -> list[dict]:
        schema = self.resolve(schema)
        if not isinstance(schema, dict) or depth > 32:
            return []
        found = [schema]
        for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            found += self.parts(sub, value, depth + 1)
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            for sub in branches if isinstance(branches, list) else []:
                if self.matches(sub, value):
                    found += self.parts(sub, value, depth + 1)
                    break
        return found

    def matches(self, schema: Any, value: Any) -> bool:
        try:
            return self.validator.evolve(schema=schema).is_valid(value)
        except Exception:  # an unresolvable $ref or a malformed branch: not this one
            return False

    def resolve(self, schema: Any) -> Any:
        from braid.grammars.json_schema.convert import resolve_pointer

        for _ in range(32):  # a $ref chain; a cycle of bare refs ends here
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
                return schema
            ref = schema["$ref"]
            schema = resolve_pointer(self.root, ref) if ref.startswith("#") else None
            if not isinstance(schema, (dict, bool)):
                return {}
        return {}


def allows(row, token_id: int) -> bool:
    word = int(row[token_id // 32])
    return (word >> (token_id % 32)) & 1 == 1


def feed(matcher, token_ids: list[int], eos_id: int, row) -> tuple[int | None, list[float]]:
    """Fill the mask before each token, then before EOS. Returns (the index of the first
    token the mask refused, len(token_ids) meaning EOS; None if all were allowed) and the
    seconds each fill took. A token the mask allows but `accept_token` refuses is a bug in
    the matcher: it raises."""
    from time import perf_counter

    seconds = []
    for i, token in enumerate([*token_ids, eos_id]):
        start = perf_counter()
        matcher.fill_bitmask(row)
        seconds.append(perf_counter() - start)
        if not allows(row, token):
            return i, seconds
        if not matcher.accept_token(token):
            raise RuntimeError(f"token {token} at {i} is in the mask but accept_token refused it")
    return None, seconds


# ---- coverage table -----------------------------------------------------------------------

_FEATURE_KEYWORDS = (
    "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "pattern", "minLength",
    "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "nullable", "minProperties", "patternProperties", "uniqueItems", "dependentSchemas",
    "dependentRequired", "if", "not", "contains", "propertyNames",
)  # fmt: skip


def schema_features(schema: Any) -> list[str]:
    """Keywords (and formats, as format:NAME) a schema uses anywhere, in a fixed order."""
    seen: set[str] = set()

    def walk(node: Any, is_schema: bool) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, is_schema)
        elif isinstance(node, dict):
            if is_schema:
                seen.update(k for k in node if k in _FEATURE_KEYWORDS)
                if isinstance(node.get("format"), str):
                    seen.add(f"format:{node['format']}")
                if "null" in (node.get("type") if isinstance(node.get("type"), list) else ()):
                    seen.add("nullable")
            for key, value in node.items():
                if key in ("properties", "$defs", "definitions", "patternProperties"):
                    if isinstance(value, dict):
                        walk(list(value.values()), True)
                elif key not in ("enum", "const", "required", "examples", "default"):
                    walk(value, True)

    walk(schema, True)
    order = {k: i for i, k in enumerate(_FEATURE_KEYWORDS)}
    return sorted(seen, key=lambda f: (order.get(f, len(order)), f))


def coverage_table(rows: list[dict]) -> str:
    """Markdown for the README: schema, features, and what compiling it gave."""
    lines = ["| schema | features | result |", "|---|---|---|"]
    for row in rows:
        result = "compiled" if row["compiled"] else f"rejected: {row['error']}"
        features = ", ".join(row["features"]) or "-"
        lines.append(f"| {row['name']} | {features} | {_cell(result)} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# ---- the workload -------------------------------------------------------------------------


def bench_grammar(args: argparse.Namespace) -> int:
    result: dict[str, Any] = {"workload": "grammar", "machine": machine()}
    result["corpus"] = _bench_corpus(args.model, args.corpus)
    if not args.skip_e2e:
        result["end_to_end"] = _bench_end_to_end(args.model)
    if args.maskbench:
        per_schema_path = args.json.with_name(args.json.stem + "-maskbench.json")
        result["maskbench"] = _bench_maskbench(args, per_schema_path)
    write_result(result, args.json)
    return 0


def _load_vocabulary(model: str | None):
    from braid import grammars
    from braid.runtime.loading.model_loader import resolve_model_dir
    from braid.runtime.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_dir(model))
    vocab = grammars.build_vocabulary(tokenizer, {tokenizer.eos_token_id})
    return tokenizer, vocab


def _bench_corpus(model: str | None, directory: Path) -> dict:
    from braid import grammars

    tokenizer, vocab = _load_vocabulary(model)
    eos = tokenizer.eos_token_id
    grammars.compile(grammars.Regex("a|b"), vocab)  # builds outlines' vocabulary once
    cold, cached, fills, coverage = [], [], [], []
    judged = right = 0
    for case in load_corpus(directory):
        constraint = grammars.JsonSchema.of(case.schema)
        row = {"name": case.name, "features": schema_features(case.schema)}
        start = time.perf_counter()
        try:
            grammar = grammars.compile(constraint, vocab)
        except ValueError as e:
            coverage.append({**row, "compiled": False, "error": str(e)})
            continue
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        grammars.compile(constraint, vocab)
        cached.append(time.perf_counter() - start)
        coverage.append({**row, "compiled": True, "error": None})
        mask = grammars.allocate_bitmask(1, vocab.size)[0]
        for valid, data in case.tests:
            ids = tokenizer.encode(serialize(data, case.schema), add_special_tokens=False)
            refused_at, seconds = feed(grammar.matcher(), ids, eos, mask)
            fills += seconds
            judged += 1
            right += (refused_at is None) == valid
    summary = {
        "schemas": len(coverage),
        "compiled": len(cold),
        "instances_judged": judged,
        "instances_right": right,
        "compile_cold_ms": _percentiles(cold, 1e3),
        "compile_cached_us": _percentiles(cached, 1e6),
        "mask_fill_us": _percentiles(fills, 1e6),
        "coverage": coverage,
    }
    print(
        f"corpus: {len(coverage)} schemas, {len(cold)} compiled, "
        f"{right}/{judged} instances judged right, {machine()}"
    )
    print(f"{'':<28}{'p50':>10}{'p99':>10}")
    for label, key in (
        ("compile, cold (ms)", "compile_cold_ms"),
        ("compile, cached (us)", "compile_cached_us"),
        ("mask fill per token (us)", "mask_fill_us"),
    ):
        print(f"{label:<28}{summary[key]['p50']:>10.1f}{summary[key]['p99']:>10.1f}")
    print()
    print(coverage_table(coverage))
    print()
    return summary


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
    print(f"{'':<16}{'tokens':>8}{'seconds':>9}{'tok/s':>8}{'TPOT p50 ms':>13}{'jump-fwd':>10}")
    for label, row in rows.items():
        print(
            f"{label:<16}{row['output_tokens']:>8}{row['seconds']:>9.2f}"
            f"{row['tokens_per_s']:>8.1f}{row['tpot_p50_s'] * 1e3:>13.1f}"
            f"{row['jump_forward_tokens']:>10}"
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
    return {
        "requests": len(outs),
        "output_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "tpot_p50_s": stats["tpot_p50_s"],
        "jump_forward_tokens": stats["jump_forward_tokens"] - before,
        "sample": outs[0].text[:200],
    }


def _percentiles(values: list[float], scale: float) -> dict:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50": statistics.median(ordered) * scale, "p99": p99 * scale, "n": len(ordered)}


# ---- MaskBench ----------------------------------------------------------------------------


def _bench_maskbench(args: argparse.Namespace, per_schema_path: Path) -> dict:
    paths = sorted(args.maskbench.glob("*.json"))
    if not paths:
        raise ValueError(f"--maskbench {args.maskbench}: no *.json files there")
    if args.limit is not None and args.limit < len(paths):
        paths = sorted(random.Random(args.seed).sample(paths, args.limit))
    results = _score_all(paths, args)
    per_schema_path.parent.mkdir(parents=True, exist_ok=True)
    per_schema_path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    summary = _maskbench_summary(results)
    peer = None
    if args.peer_python:
        peer_results = _score_peer(paths, args, per_schema_path.with_suffix(".peer.json"))
        peer = {"engine": peer_results.pop(), **_maskbench_summary(peer_results)}
        summary["peer"] = peer
    _print_maskbench(summary, results, peer)
    print(f"wrote {per_schema_path}")
    return summary


def _score_all(paths: list[Path], args: argparse.Namespace) -> list[dict]:
    """Score schemas in `args.jobs` worker processes; a worker past its schema's deadline is
    killed and replaced, and the schema counts as a compile error."""
    deadline_s = 2 * args.timeout + 60  # compile, then feeding every instance
    strict = not args.spec_objects
    spawn = lambda: _Scorer(args.model, args.timeout, args.memory_mb, strict)  # noqa: E731
    scorers = [spawn() for _ in range(max(1, min(args.jobs, len(paths))))]
    pending = list(reversed(paths))
    results: list[dict] = []
    busy: dict[Connection, tuple[Path, float]] = {}
    reported = 0
    try:
        while pending or busy:
            for scorer in scorers:
                if pending and scorer.conn not in busy:
                    path = pending.pop()
                    scorer.conn.send(str(path))
                    busy[scorer.conn] = (path, time.monotonic() + deadline_s)
            nearest = min(d for _, d in busy.values())
            for conn in wait(list(busy), timeout=max(0.0, nearest - time.monotonic())):
                path, _ = busy.pop(conn)
                try:
                    results.append(conn.recv())
                except (EOFError, OSError):
                    results.append(_crashed(path, "the scoring worker died (memory?)"))
                    _replace(scorers, conn, spawn)
            now = time.monotonic()
            for conn, (path, deadline) in list(busy.items()):
                if now > deadline:
                    busy.pop(conn)
                    results.append(_crashed(path, f"no result within {deadline_s:g} s"))
                    _replace(scorers, conn, spawn)
            if len(results) >= reported + 50:
                reported = len(results)
                print(f"  {reported}/{len(paths)} schemas scored", flush=True)
    finally:
        for scorer in scorers:
            scorer.stop()
    return sorted(results, key=lambda r: r["name"])


def _crashed(path: Path, why: str) -> dict:
    return {"name": path.stem, "status": "compile_error", "error": why}


def _replace(scorers: list, conn: Connection, spawn) -> None:
    for i, scorer in enumerate(scorers):
        if scorer.conn is conn:
            scorer.stop()
            scorers[i] = spawn()


class _Scorer:
    """A process that scores one MaskBench file at a time."""

    def __init__(self, model: str | None, timeout_s: float, memory_mb: int, strict: bool) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_scorer_main, args=(child, model, timeout_s, memory_mb, strict)
        )
        self.process.start()
        child.close()

    def stop(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


def _scorer_main(
    conn: Connection, model: str | None, timeout_s: float, memory_mb: int, strict: bool
) -> None:
    from braid import grammars

    tokenizer, vocab = _load_vocabulary(model)
    compiler = grammars.GrammarCompiler(vocab, timeout_s=timeout_s, max_memory_mb=memory_mb)
    compiler.submit(grammars.Regex("a|b")).result()  # start the index worker before timing
    mask = grammars.allocate_bitmask(1, vocab.size)[0]
    while True:
        try:
            path = conn.recv()
        except EOFError:
            return
        conn.send(_score_one(load_case(Path(path)), compiler, tokenizer, mask, strict))


def _score_one(case: SchemaCase, compiler, tokenizer, mask, strict: bool) -> dict:
    from braid import grammars

    out: dict[str, Any] = {"name": case.name}
    start = time.perf_counter()
    try:
        grammar = compiler.submit(grammars.JsonSchema.of(case.schema, strict=strict)).result()
        grammar.matcher().fill_bitmask(mask)
    except ValueError as e:
        return {**out, "status": "compile_error", "error": str(e)}
    out["ttfm_s"] = time.perf_counter() - start
    out["fill_s"], out["validation_errors"], out["invalidation_errors"] = [], [], []
    eos = tokenizer.eos_token_id
    for index, (valid, data) in enumerate(case.tests):
        text = serialize(data, case.schema)
        ids = tokenizer.encode(text, add_special_tokens=False)
        try:
            refused_at, seconds = feed(grammar.matcher(), ids, eos, mask)
        except RuntimeError as e:  # mask and accept_token disagree: report, do not stop
            out["invalidation_errors" if not valid else "validation_errors"].append(
                {"index": index, "text": text[:300], "error": str(e)}
            )
            continue
        out["fill_s"] += seconds
        if valid and refused_at is not None:
            accepted = tokenizer.decode(ids[:refused_at])
            out["validation_errors"].append(
                {"index": index, "text": text[:300], "refused_after": accepted[-80:],
                 "refused": "EOS" if refused_at == len(ids) else tokenizer.decode(ids[refused_at])}
            )  # fmt: skip
        elif not valid and refused_at is None:
            out["invalidation_errors"].append({"index": index, "text": text[:300]})
    bad = out["validation_errors"] or out["invalidation_errors"]
    out["status"] = "fail" if bad else "pass"
    return out


def _maskbench_summary(results: list[dict]) -> dict:
    fills = [s for r in results for s in r.pop("fill_s", [])]
    ttfm = [r["ttfm_s"] for r in results if "ttfm_s" in r]
    compile_errors = [r for r in results if r["status"] == "compile_error"]
    return {
        "schemas": len(results),
        "passing": sum(r["status"] == "pass" for r in results),
        "compile_errors": len(compile_errors),
        "schemas_with_validation_errors": sum(bool(r.get("validation_errors")) for r in results),
        "schemas_with_invalidation_errors": sum(
            bool(r.get("invalidation_errors")) for r in results
        ),
        "validation_errors": sum(len(r.get("validation_errors", ())) for r in results),
        "invalidation_errors": sum(len(r.get("invalidation_errors", ())) for r in results),
        "tbm_us": _percentiles(fills, 1e6),
        "ttfm_ms": _percentiles(ttfm, 1e3),
        "compile_error_reasons": Counter(_reason(r["error"]) for r in compile_errors).most_common(),
    }


# ---- a peer engine on the same schemas: llguidance, in a Python of its own ----------------

# Run by --peer-python: reads {"tokenizer", "eos", "cases": [{"name", "schema", "tests":
# [[valid, token ids]]}]} from the file named by argv[1], writes per-schema results in
# _score_one's shape (plus the engine's name, last) to argv[2]. One thread; time to first
# mask is making the grammar and the matcher and filling the first mask, as for braid.
_LLGUIDANCE_SCORER = r"""
import json, sys, time
import llguidance, llguidance.hf, llguidance.numpy
from transformers import AutoTokenizer

job = json.load(open(sys.argv[1]))
hf = AutoTokenizer.from_pretrained(job["tokenizer"])
tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=job["eos"])
mask = llguidance.numpy.allocate_token_bitmask(1, len(hf))
out = []

def allowed(token):
    return (int(mask[0, token // 32]) >> (token % 32)) & 1 == 1

for case in job["cases"]:
    row = {"name": case["name"]}
    start = time.perf_counter()
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(case["schema"])
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if not matcher.is_error():
            llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
    except Exception as e:
        out.append({**row, "status": "compile_error", "error": str(e)[:300]})
        continue
    if matcher.is_error():
        out.append({**row, "status": "compile_error", "error": matcher.get_error()[:300]})
        continue
    row.update(ttfm_s=time.perf_counter() - start, fill_s=[], validation_errors=[],
               invalidation_errors=[])
    for index, (valid, ids) in enumerate(case["tests"]):
        matcher.reset()
        refused = None
        for i, token in enumerate(ids + [job["eos"]]):
            tick = time.perf_counter()
            llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
            row["fill_s"].append(time.perf_counter() - tick)
            if not allowed(token):
                refused = i
                break
            if i < len(ids):
                matcher.consume_token(token)
        if valid and refused is not None:
            row["validation_errors"].append({"index": index, "refused_at": refused})
        elif not valid and refused is None:
            row["invalidation_errors"].append({"index": index})
    bad = row["validation_errors"] or row["invalidation_errors"]
    out.append({**row, "status": "fail" if bad else "pass"})
out.append("llguidance " + llguidance.__version__)
json.dump(out, open(sys.argv[2], "w"))
"""


def _score_peer(paths: list[Path], args: argparse.Namespace, out_path: Path) -> list[dict]:
    """llguidance's results on the same schemas, instances and tokenizer (serialized and
    tokenized here, as for braid), from a subprocess in --peer-python; its engine's name
    last."""
    import subprocess
    import tempfile

    from braid.runtime.loading.model_loader import resolve_model_dir

    tokenizer, _ = _load_vocabulary(args.model)
    cases = []
    for path in paths:
        case = load_case(path)
        tests = [
            [valid, tokenizer.encode(serialize(data, case.schema), add_special_tokens=False)]
            for valid, data in case.tests
        ]
        cases.append({"name": case.name, "schema": case.schema, "tests": tests})
    job = {
        "tokenizer": str(resolve_model_dir(args.model)),
        "eos": tokenizer.eos_token_id,
        "cases": cases,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as job_file:
        json.dump(job, job_file)
        job_file.flush()
        subprocess.run(
            [args.peer_python, "-c", _LLGUIDANCE_SCORER, job_file.name, str(out_path)],
            check=True,
            timeout=3600,
        )
    return json.loads(out_path.read_text())


def _reason(message: str) -> str:
    """An error message with its schema-specific parts (paths, numbers, long regexes) cut,
    so that equal causes count together."""
    message = re.sub(r" at [#/][^\s:,)]*", "", message)
    message = re.sub(r"regex '.*' cannot", "regex ... cannot", message)
    message = re.sub(r"\d+(\.\d+)?", "N", message)
    return message[:160]


def _print_maskbench(summary: dict, results: list[dict], peer: dict | None = None) -> None:
    n = summary["schemas"]
    scale = n / MASKBENCH_SCHEMAS
    print(f"MaskBench: {n} schemas (published rows scaled from {MASKBENCH_SCHEMAS:,} to {n})")
    print("| engine | passing | invalidation errors | TBM p50 / p99 (us) | TTFM p50 / p99 (ms) |")
    print("|---|---|---|---|---|")
    measured = [("braid", summary)] + ([(f"{peer['engine']}, this run", peer)] if peer else [])
    for engine, row in measured:
        tbm, ttfm = row["tbm_us"], row["ttfm_ms"]
        print(
            f"| {engine} | {row['passing']:,} | {row['schemas_with_invalidation_errors']:,} "
            f"| {tbm['p50']:.0f} / {tbm['p99']:.0f} | {ttfm['p50']:.1f} / {ttfm['p99']:.0f} |"
        )
    tbm, ttfm = summary["tbm_us"], summary["ttfm_ms"]
    for engine, (passing, invalid, p50, p99, ttfm_p50) in PUBLISHED.items():
        print(
            f"| {engine} | {passing * scale:,.0f} | {invalid * scale:,.0f} "
            f"| {p50:,} / {p99:,} | {ttfm_p50:g} |"
        )
    print(
        f"\nbraid: {summary['passing']} passing, {summary['compile_errors']} compile errors, "
        f"{summary['schemas_with_validation_errors']} schemas with validation errors "
        f"({summary['validation_errors']} instances), "
        f"{summary['schemas_with_invalidation_errors']} with invalidation errors "
        f"({summary['invalidation_errors']} instances); TTFM p99 {ttfm['p99']:.0f} ms"
    )
    print("\ncompile errors by reason:")
    for reason, count in summary["compile_error_reasons"][:20]:
        print(f"{count:>6}  {reason}")
    for kind in ("invalidation_errors", "validation_errors"):
        examples = [(r["name"], e) for r in results for e in r.get(kind, ())][:10]
        if examples:
            print(f"\n{kind.replace('_', ' ')} (first {len(examples)}):")
            for name, error in examples:
                print(f"  {name}: {json.dumps(error, ensure_ascii=False)[:400]}")
