"""`braid bench grammar --maskbench DIR`: JSONSchemaBench's mask corpus, scored as
/work/shared/data/README.md describes: per schema, compile (time to first mask, TTFM), then
feed each test instance token by token to a fresh matcher, filling the mask before every
token; a schema passes when valid instances are accepted to the end (then EOS) and invalid
ones are rejected somewhere. Each schema runs in a worker process that is killed past a
deadline, so a schema that hangs or blows memory is a compile error, never a stall."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import re
import time
from collections import Counter
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from braid.runtime.cli.bench.grammar_cases import (
    SchemaCase,
    feed,
    load_case,
    load_vocabulary,
    percentiles,
    serialize,
)
from braid.runtime.cli.bench.grammar_peer import score_peer

# Published MaskBench figures (11,306 schemas, Llama-3.1 tokenizer), from the data README:
# engine -> (passing, invalidation errors, TBM p50 us, TBM p99 us, TTFM p50 ms).
MASKBENCH_SCHEMAS = 11_306
PUBLISHED = {
    "llguidance 0.7.10": (8_909, 0, 46, 533, 1.0),
    "XGrammar 0.1.17": (8_122, 1_368, 9, 5_687, 919),
    "outlines-core 0.2.3": (7_050, 822, 34, 7_184, 588),
    "llama.cpp grammars": (6_505, 649, 17_021, 60_371, 0.3),
}


def maskbench_cases(directory: Path, limit: int | None, seed: int) -> list[SchemaCase]:
    """MaskBench's files in `directory` (one JSON a schema), a seeded sample of `limit`."""
    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise ValueError(f"--maskbench {directory}: no *.json files there")
    if limit is not None and limit < len(paths):
        paths = sorted(random.Random(seed).sample(paths, limit))
    return [load_case(path) for path in paths]


def bench_maskbench(
    args: argparse.Namespace, cases: list[SchemaCase], per_schema_path: Path, title: str
) -> dict:
    """Score `cases` as MaskBench does (and llguidance on them with --peer-python), write
    per-schema results to `per_schema_path`, print the table under `title` (MaskBench's
    published rows beside it when the title is "MaskBench"); the summary."""
    results = _score_all(cases, args)
    per_schema_path.parent.mkdir(parents=True, exist_ok=True)
    per_schema_path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    summary = _maskbench_summary(results)
    peer = None
    if args.peer_python:
        peer_results = score_peer(cases, args, per_schema_path.with_suffix(".peer.json"))
        peer = {"engine": peer_results.pop(), **_maskbench_summary(peer_results)}
        summary["peer"] = peer
    _print_maskbench(title, summary, results, peer)
    print(f"wrote {per_schema_path}")
    return summary


def _score_all(cases: list[SchemaCase], args: argparse.Namespace) -> list[dict]:
    """Score schemas in `args.jobs` worker processes; a worker past its schema's deadline is
    killed and replaced, and the schema counts as a compile error."""
    deadline_s = 2 * args.timeout + 60  # compile, then feeding every instance
    strict = not args.spec_objects
    spawn = lambda: _Scorer(args.model, args.timeout, args.memory_mb, strict)  # noqa: E731
    scorers = [spawn() for _ in range(max(1, min(args.jobs, len(cases))))]
    pending = list(reversed(cases))
    results: list[dict] = []
    busy: dict[Connection, tuple[SchemaCase, float]] = {}
    reported = 0
    try:
        while pending or busy:
            for scorer in scorers:
                if pending and scorer.conn not in busy:
                    case = pending.pop()
                    scorer.conn.send(case)
                    busy[scorer.conn] = (case, time.monotonic() + deadline_s)
            nearest = min(d for _, d in busy.values())
            for conn in wait(list(busy), timeout=max(0.0, nearest - time.monotonic())):
                case, _ = busy.pop(conn)
                try:
                    results.append(conn.recv())
                except (EOFError, OSError):
                    results.append(_crashed(case, "the scoring worker died (memory?)"))
                    _replace(scorers, conn, spawn)
            now = time.monotonic()
            for conn, (case, deadline) in list(busy.items()):
                if now > deadline:
                    busy.pop(conn)
                    results.append(_crashed(case, f"no result within {deadline_s:g} s"))
                    _replace(scorers, conn, spawn)
            if len(results) >= reported + 50:
                reported = len(results)
                print(f"  {reported}/{len(cases)} schemas scored", flush=True)
    finally:
        for scorer in scorers:
            scorer.stop()
    return sorted(results, key=lambda r: r["name"])


def _crashed(case: SchemaCase, why: str) -> dict:
    return {"name": case.name, "status": "compile_error", "error": why}


def _replace(scorers: list, conn: Connection, spawn) -> None:
    for i, scorer in enumerate(scorers):
        if scorer.conn is conn:
            scorer.stop()
            scorers[i] = spawn()


class _Scorer:
    """A process that scores one schema case at a time."""

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

    tokenizer, vocab = load_vocabulary(model)
    compiler = grammars.GrammarCompiler(vocab, timeout_s=timeout_s, max_memory_mb=memory_mb)
    compiler.submit(grammars.Regex("a|b")).result()  # start the index worker before timing
    mask = grammars.allocate_bitmask(1, vocab.size)[0]
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        conn.send(score_one(case, compiler, tokenizer, mask, strict))


def score_one(case: SchemaCase, compiler, tokenizer, mask, strict: bool) -> dict:
    """One schema's result: compile error, or pass/fail with its TTFM, fill times and the
    instances judged wrong."""
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
        "tbm_us": percentiles(fills, 1e6),
        "ttfm_ms": percentiles(ttfm, 1e3),
        "compile_error_reasons": Counter(_reason(r["error"]) for r in compile_errors).most_common(),
    }


def _reason(message: str) -> str:
    """An error message with its schema-specific parts (paths, numbers, long regexes) cut,
    so that equal causes count together."""
    message = re.sub(r" at [#/][^\s:,)]*", "", message)
    message = re.sub(r"regex '.*' cannot", "regex ... cannot", message)
    message = re.sub(r"\d+(\.\d+)?", "N", message)
    return message[:160]


def _print_maskbench(title: str, summary: dict, results: list[dict], peer: dict | None) -> None:
    n = summary["schemas"]
    scale = n / MASKBENCH_SCHEMAS
    published = PUBLISHED if title == "MaskBench" else {}
    scaled = f" (published rows scaled from {MASKBENCH_SCHEMAS:,} to {n})" if published else ""
    print(f"{title}: {n} schemas{scaled}")
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
    for engine, (passing, invalid, p50, p99, ttfm_p50) in published.items():
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
