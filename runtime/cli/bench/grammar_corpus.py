"""`braid bench grammar` on our corpus (tests/data/schemas): compile times (cold and cached),
the time to fill one mask (TBM), instances judged, and the coverage table for the README."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from braid.runtime.cli.bench.common import machine
from braid.runtime.cli.bench.grammar_cases import (
    feed,
    load_corpus,
    load_vocabulary,
    percentiles,
    serialize,
)

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


def bench_corpus(model: str | None, directory: Path) -> dict:
    """Compile every schema in `directory`, judge its instances, print the tables."""
    from braid import grammars

    tokenizer, vocab = load_vocabulary(model)
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
        "compile_cold_ms": percentiles(cold, 1e3),
        "compile_cached_us": percentiles(cached, 1e6),
        "mask_fill_us": percentiles(fills, 1e6),
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
